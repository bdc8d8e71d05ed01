"""A sizing function that never returns."""

import time


def sizing(host):
    while True:
        time.sleep(1)
