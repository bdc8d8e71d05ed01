"""A sizing function written out by hand in vLLM 0.33.0's shape (no cpsim import): the spec's
max_num_blocks_per_req (attention cdiv(max_len, B x DCP) when sharded, circular 1, mamba in align
mode cdiv(max_len, B) + speculative blocks), then get_block_table_width's 128-token alignment;
slot buffer max_num_batched_tokens."""

import math

def cdiv(a, b):
    return -(-a // b)


def align(n, block_size, tokens=128):
    step = tokens // math.gcd(tokens, block_size)
    return cdiv(n, step) * step


def width(host, g):
    mml, B = host["max_model_len"], g["block_size"]
    if g["kind"] == "mamba":
        return cdiv(mml, B) + host["num_speculative_tokens"]
    if g["kind"] == "circular":
        return align(1, B) if host["host"] == "v1" else 1
    return align(cdiv(mml, B * (host["dcp_world_size"] if g["cp_sharded"] else 1)), B)


def sizing(host):
    return {"table_widths": [width(host, g) for g in host["groups"]],
            "slot_buffer_len": host["max_num_batched_tokens"]}
