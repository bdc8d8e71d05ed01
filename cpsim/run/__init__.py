"""Running the ranks: the virtual world in one process, or one process per rank under torchrun."""
