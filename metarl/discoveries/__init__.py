"""Discoveries taken out of their runs: one portable file per evolved objective.

* :mod:`.fileformat`: the ``.npz`` file (meta-parameters and a JSON card), read by plain
  numpy without metarl.
* :mod:`.contracts`: what each slot's inputs mean and where the algorithm computes them.
* :mod:`.card`: a run directory's discovery and card (objective, inputs, what it was found
  under, its verdicts, distilled formulas, caveats).
* :mod:`.export`: ``metarl export RUN_DIR``, writing the file.
* :mod:`.load`: ``metarl.load_objective(FILE | RUN_DIR | "zoo:<name>")``, the discovery as
  plain JAX functions.
* :mod:`.materialise`: a file as a run directory, for ``metarl evaluate FILE``.
* :mod:`.zoo`: the discoveries the evidence pages report, shipped with the package.
"""
