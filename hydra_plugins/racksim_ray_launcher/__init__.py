"""rackSim's Hydra launcher on Ray: `racksim -m hydra/launcher=racksim_ray ...`."""
