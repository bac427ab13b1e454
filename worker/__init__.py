"""The Phalanx worker: elastic launcher, training library and checkpoints."""
