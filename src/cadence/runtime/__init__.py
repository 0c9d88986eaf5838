"""The process runtime: launch topology, hardware probes, the process group and its control
(barriers, first-process blocks), the process state (PartialState, AcceleratorState, GradientState),
collectives over nested data, and the multi-process logger."""
