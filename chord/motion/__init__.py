"""CHORD's motion representation (METHOD §4–§7): control-point layers with Fenwick temporal
tables (``fenwick``, ``layer``), skinning, the optional second layer and the scene container
(``model``), the state file (``state``) and scripted motions (``scripted``). Import the
modules themselves: this package imports nothing, so reading a scripted motion (the DAG
build, the demo) does not load torch."""
