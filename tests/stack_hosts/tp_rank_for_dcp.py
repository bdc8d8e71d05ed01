"""Our ascend-shape classes with a group bug only real process groups show: the block table takes its
DCP rank from the tensor-parallel group (``get_tp_group().rank_in_group``) instead of the DCP group.
Where TP = DCP the two agree; where TP > DCP (a world of several DCP groups, each DCP rank held by
several TP ranks) the second group's ranks claim DCP ranks past the group."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ascend_shape import *  # noqa: E402,F401,F403
import ascend_shape  # noqa: E402

NAME = "tp_rank_for_dcp (DCP rank read from the TP group)"


def get_tp_group():
    import torch.distributed as dist
    return ascend_shape.Group(dist.get_world_size(), dist.get_rank(), None)


_init = ascend_shape.BlockTable.__init__


def _init_with_tp_rank(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.dcp_rank = get_tp_group().rank_in_group


ascend_shape.BlockTable.__init__ = _init_with_tp_rank
