"""ascend_shape's correct sizing that appends its process id to $CPSIM_TEST_SIZING_LOG at every call:
the test counts the processes that answered a search, and the calls."""

import os

import ascend_shape  # noqa: E402  (tests/sizing is on sys.path: the file's folder)


def sizing(host):
    with open(os.environ["CPSIM_TEST_SIZING_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return ascend_shape.sizing(host)
