"""The run's lifecycle beside the launcher: stops and faults, the control folder, a worker's exit,
its console log, the start-up lines and the run folder. Training parts are in ``components/``."""
