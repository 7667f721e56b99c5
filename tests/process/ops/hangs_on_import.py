"""A module whose import never finishes (a worker stuck while starting)."""

import time

time.sleep(3600)


def never(subject):
    return None
