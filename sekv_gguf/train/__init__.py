"""Training the zoom-in router: the student model and its loss (``student``); teacher capture and the training loop
build on it."""
