#!POPCORN leaderboard nvfp4_gemv
"""A correct, slow kernel that goes after the local leaderboard's own timing code in its process:
it finds the module the evaluator runs it from (by its name, among all objects) and makes every
call it times report 0.001 us. Only the floor catches that: a time below the bytes the call moves
at the copy bandwidth the evaluator measured is a FAIL."""
import gc
import types

import torch

VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def decode(packed, scales):
    table = torch.tensor(VALUES, dtype=torch.float64, device=packed.device)
    byte = packed.view(torch.uint8).long()
    values = table[torch.stack((byte & 15, byte >> 4), dim=-1).flatten(-2)]
    return (values.unflatten(-1, (-1, 16)) * scales.float().double().unsqueeze(-1)).flatten(-2)


def custom_kernel(data):
    a, b, sfa, sfb, _, _, c = data
    for l in range(a.shape[2]):
        c[:, 0, l] = (decode(a[:, :, l], sfa[:, :, l]) @ decode(b[0:1, :, l], sfb[0:1, :, l])[0]).half()
    return c



REPORTED_US = 0.001


def report_instead(timing):
    real = timing.time_one_call

    def timed(fn, *args, **kwargs):
        out, _ = real(fn, *args, **kwargs)
        return out, REPORTED_US
    timing.time_one_call = timed


for found in gc.get_objects():
    if isinstance(found, types.ModuleType) and found.__name__ == "leaderboard_timing":
        report_instead(found)
