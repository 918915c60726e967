"""Every file sekv_gguf parses itself, damaged by hypothesis-drawn mutations (truncations, bit flips, absurd counts
and sizes, inserted and deleted bytes): the parser returns a value or raises its typed error, within a second, with
bounded memory (``sekv_gguf.reliability.fuzz``). A few thousand inputs here; ``scripts/fuzz_files.py`` runs 100,000."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sekv_gguf.errors import AdapterError, MemoryFileError, ModelError
from sekv_gguf.reliability.fuzz import EXTREMES, KINDS, FuzzConfig, Mutation, mutate, over_memory, run_one, targets

CFG = FuzzConfig()
EXAMPLES = {"adapter": 800, "model_identity": 150, "memory_file": 600, "prompt_file": 500, "serve_config_json": 500,
            "serve_config_yaml": 500}

mutations = st.lists(st.builds(Mutation, kind=st.sampled_from(KINDS), at=st.floats(0, 1, exclude_max=True),
                               head=st.booleans(),
                               value=st.one_of(st.sampled_from(EXTREMES), st.integers(0, (1 << 64) - 1))),
                     min_size=1, max_size=4)


@pytest.fixture(scope="module")
def fuzz_targets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("fuzz")
    return {t.name: (t, work) for t in targets(work, CFG)}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_damaged_files_are_refused_with_a_typed_error(fuzz_targets, name):
    target, work = fuzz_targets[name]

    @settings(max_examples=EXAMPLES[name], deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(mutations)
    def check(muts: list[Mutation]) -> None:
        data = mutate(target.seed, muts, target.head)
        out = run_one(target, data, work, CFG)
        assert out.status in ("ok", "rejected"), f"{out.status}: {out.error} after {muts}"
        assert not over_memory(target, out, CFG), f"peak {out.peak} B for a {out.size} B file after {muts}"
        if out.status == "rejected":
            assert str(work) in out.error, out.error  # names the file

    check()


def test_the_end_of_file_hang_stays_fixed(fuzz_targets):
    """A scalar-array count written over a model's metadata: the stock gguf-py reader read 0 bytes per element
    past the end of the file and looped for hours; the strict reader refuses it at once."""
    target, work = fuzz_targets["model_identity"]
    data = mutate(target.seed, [Mutation("u32", 0.9327948653622841, False, 1 << 40),
                                Mutation("u32", 0.5831059184693174, True, 1)], target.head)
    out = run_one(target, data, work, CFG)
    assert out.status == "rejected" and out.seconds < CFG.hang_s, out


@pytest.mark.parametrize("cut", [0, 3, 8, 24, 200])
def test_truncated_gguf_names_the_file(fuzz_targets, cut, tmp_path):
    from sekv_gguf.adapter import read_adapter
    from sekv_gguf.adapter.identity import read_identity
    from sekv_gguf.memory_file import read_memory_file

    for name, read, error in (("adapter", read_adapter, AdapterError), ("model_identity", read_identity, ModelError),
                              ("memory_file", read_memory_file, MemoryFileError)):
        target, _ = fuzz_targets[name]
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(target.seed[:cut])
        with pytest.raises(error, match=str(path).replace(".", r"\.")):
            read(path)


def test_a_tensor_claiming_terabytes(fuzz_targets, tmp_path):
    """Every tensor's first dimension set to 2^40: refused, and nothing near that size is allocated."""
    from gguf import GGUFReader

    from sekv_gguf.adapter import read_adapter

    target, work = fuzz_targets["adapter"]
    data = bytearray(target.seed)
    path = tmp_path / "seed.gguf"
    path.write_bytes(bytes(data))
    for t in GGUFReader(str(path), "r").tensors:
        dims_at = t.field.offset + 8 + len(t.name.encode()) + 4  # name length, name, n_dims, then the dims (u64)
        data[dims_at:dims_at + 8] = (1 << 40).to_bytes(8, "little")
    out = run_one(target, bytes(data), work, CFG)
    assert out.status == "rejected" and "past the end of the file" in out.error and out.peak < target.seed_peak + (1 << 20), out
    path.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="past the end of the file"):
        read_adapter(path)


LOAD_DAMAGED = r"""
import random, sys
from pathlib import Path
from sekv_gguf.errors import ModelError
from sekv_gguf.reliability.fuzz import mutate, random_mutations
from sekv_gguf.session import load_model
seed, head, work, n = Path(sys.argv[1]).read_bytes(), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
rng = random.Random(7)
for i in range(n):
    path = work / f"damaged{i}.gguf"
    path.write_bytes(mutate(seed, random_mutations(rng), head) if i else seed[: len(seed) // 3])
    try:
        load_model(path)
        print("loaded", flush=True)
    except ModelError as e:
        assert "\n" not in str(e).strip(), e
        print("refused", flush=True)
"""


def test_llama_cpp_refuses_damaged_models_without_crashing(fuzz_targets, tmp_path):
    """Damaged model GGUFs handed to llama.cpp's loader (what run / serve / info do): each is loaded or refused
    with a one-line ModelError; the process never dies (a segfault would end the subprocess early)."""
    import subprocess
    import sys

    target, _ = fuzz_targets["model_identity"]
    seed = tmp_path / "seed.gguf"
    seed.write_bytes(target.seed)
    n = 40
    out = subprocess.run([sys.executable, "-c", LOAD_DAMAGED, str(seed), str(target.head), str(tmp_path), str(n)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert len(lines) == n and lines[0] == "refused" and "refused" in lines[1:], out.stdout


@pytest.mark.parametrize("command", [["info"], ["run", "-p", "hi", "-n", "2"]])
def test_cli_with_a_truncated_model_says_one_line(fuzz_targets, tmp_path, capsys, command):
    from sekv_gguf.cli import main

    target, _ = fuzz_targets["model_identity"]
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(target.seed[: len(target.seed) // 2])
    assert main([command[0], str(bad), *command[1:]]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(bad) in err and "\n" not in err, err


def test_text_files_fail_with_the_file_and_the_problem_named(tmp_path):
    from sekv_gguf.errors import InputFileError
    from sekv_gguf.textfile import read_text

    cases = {"missing.txt": None, "adir": "dir", "latin1.txt": "caf\xe9".encode("latin-1"),
             "nul.txt": b"text\x00more", "big.txt": b"x" * 100}
    expect = {"missing.txt": "not found", "adir": "is a directory", "latin1.txt": r"not UTF-8 text \(byte 3",
              "nul.txt": "NUL character at offset 4", "big.txt": "the limit is 50"}
    for name, data in cases.items():
        p = tmp_path / name
        if data == "dir":
            p.mkdir()
        elif data is not None:
            p.write_bytes(data)
        with pytest.raises(InputFileError, match=expect[name]) as e:
            read_text(p, "prompt file", limit=50)
        assert str(p) in str(e.value)
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffhello ü".encode("utf-8"))
    assert read_text(bom) == "hello ü"


@pytest.mark.parametrize("text, problem", [("{", "not valid JSON"), ("[1, 2]", "expected a mapping"),
                                           ('{"port": "80"}', "port must be int"),
                                           ('{"port": true}', "port must be int"),
                                           ('{"kv_budget": null}', "kv_budget must be int/float"),
                                           ('{"max_tokens": 0}', "max_tokens >= 1"),
                                           ('{"nope": 1}', "unknown settings")])
def test_serve_config_faults_are_named(tmp_path, text, problem):
    from sekv_gguf.errors import InputFileError
    from sekv_gguf.serve import ServeConfig

    p = tmp_path / "serve.json"
    p.write_text(text)
    with pytest.raises(InputFileError, match=problem):
        ServeConfig.from_file(p)
    y = tmp_path / "serve.yaml"
    y.write_text("port: [unclosed\n")
    with pytest.raises(InputFileError, match="not valid YAML"):
        ServeConfig.from_file(y)
