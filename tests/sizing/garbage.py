"""Sizing functions that answer garbage (each named by the test)."""


def wrong_keys(host):
    return {"widths": [1] * len(host["groups"]), "slot_buffer_len": 10}


def short_list(host):
    return {"table_widths": [], "slot_buffer_len": host["max_num_batched_tokens"]}


def huge(host):
    return {"table_widths": [2**40] * len(host["groups"]), "slot_buffer_len": host["max_num_batched_tokens"]}


def floats(host):
    return {"table_widths": [1.5] * len(host["groups"]), "slot_buffer_len": host["max_num_batched_tokens"]}


def not_json(host):
    return {"table_widths": [object()] * len(host["groups"]), "slot_buffer_len": 1}
