"""The HF engine's CPU kernel patches of a loaded model; :mod:`.patches` applies and reverts them all."""
