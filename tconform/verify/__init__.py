"""`tconform verify`: the shipped cases' models on every runtime against the goldens.

  run.py      verify(): the run top to bottom, into one RunReport
  models.py   which model each lane checks: given, held as it is, or exported (also --matrix)
  execute.py  a lane's results: execute, judge, stamp cell and unit; localise failures
The plan (cases, lanes, cells, units, shards) is tconform.plan.
"""

from __future__ import annotations

from tconform.plan import VerifyOptions
from tconform.verify.run import verify

__all__ = ["VerifyOptions", "verify"]
