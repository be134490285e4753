"""The emulator's calibration and its studies, apart from the emulator service (engine_sim).

- `calibration.py`: the published points the emulator is fitted to, and the step model's
  steady-state predictions for them;
- `step_fit.py`: the least-squares fit of a profile's step costs to those points
  (`scripts/fit_profile.py`);
- `fidelity.py`: `slotshift bench-fidelity`, the real emulator at each point, measured;
- `tradeoff.py`: `slotshift bench-tradeoff`, the engine core in virtual time.
"""
