"""The parts of `make bench` (scripts/bench.py, its one entry point): each module measures one
section and writes its table; trainer_job.py is the Trainer's process that the phases section times."""
