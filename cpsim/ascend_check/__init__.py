"""Offline compile check for Ascend: every kernel through triton-ascend up to ``triton-adapter-opt``.

triton-ascend ships its own module ``triton``, so it lives in a side venv
(``.venv-ascend``, made by ``make ascend-venv``) and the compilation runs there in
worker processes (``cpsim.ascend_check.compile_worker``); this package's other modules
run in cpsim's own venv and never import triton.
"""
