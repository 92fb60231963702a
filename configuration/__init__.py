"""The deploy's data, loaded and validated on the control machine before any host is touched: the
operators' group data (`settings`), the pinned stacks (`stacks`) and the engine's own flag lists
(`engine_flags`), each file read by one strict YAML loader (`yamlload`); a bad value anywhere raises
a `DataError` (`errors`) naming the file, key, value and fix, so the run stops before any operation
is added."""
