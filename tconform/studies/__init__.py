"""What tconform's scripts measure with its stages, kept apart from the package's workflows
(nothing in the package imports this; scripts/ and the tests do):

  faults.py           graph edits that inject a mistake into an exported model
  fault_catalogue.py  the named faults, and what an output comparison can see of each
  sensitivity.py      what each input set and tolerance row catches (docs/sensitivity.md)
  checkpoints.py      trained checkpoints scored by decoding (scripts/train_checkpoint.py)
"""
