"""CHORD's motion representation (METHOD §4–§7): control-point layers with Fenwick temporal
tables, skinning, the optional second layer, the scene container and the state file."""

from chord.motion.fenwick import progressive_reset, reset_enabled, table_size
from chord.motion.layer import ControlPointLayer
from chord.motion.model import DynamicObject, MotionScene, build_scene, plan_second_layer

__all__ = [
    "ControlPointLayer",
    "DynamicObject",
    "MotionScene",
    "build_scene",
    "plan_second_layer",
    "progressive_reset",
    "reset_enabled",
    "table_size",
]
