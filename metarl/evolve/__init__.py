"""Run kind "evolve": an evolution strategy (evosax) over the meta-parameters of a learned
objective, each candidate scored by agents trained from scratch with it.

One module per job, each importing only those listed before it:

- :mod:`.strategies`: the evosax strategies by name, what settings reach each, and how each
  starts, asks and is told (evosax is imported only when one is built);
- :mod:`.metagradient_config`: the ``[meta]`` table, one type per engine that searches
  (evolution or meta-gradients), the meta-gradient engine's with its settings;
- :mod:`.config`: the experiment file's tables (objective, inner, es, fitness, run, meta);
- :mod:`.fitness`: training runs of candidates × seeds × environments -> one fitness each;
- :mod:`.rungs`: a generation trained in rungs that stop all but the best candidates
  (successive halving);
- :mod:`.generation`: the jitted generation (ask, train, score, tell) and its state;
- :mod:`.metagradient`: the other engine, the jitted meta-gradient step (``K`` PPO updates
  of every agent differentiated with respect to the meta-parameters) and its state;
- :mod:`.engines`: what reading a run needs of the engine that ran it (where its search
  started, its fitness figure), by the type of its ``[meta]`` table;
- :mod:`.tuning`: each objective searched over its declared grid on tuning seeds (tuned
  baselines, and fitness normalised by the tuned baseline);
- :mod:`.rows`: one objective trained on held-out seeds, a row of an evaluation;
- :mod:`.plan`: the trainings an evaluation needs, and their execution through the
  training store;
- :mod:`.verdicts`: an evaluation's results, statistics and verdicts from what its
  plan trained;
- :mod:`.evaluate`: the evolved objective against baselines on held-out seeds (options,
  spec and record);
- :mod:`.report`: a run's figures (fitness, the learned loss, learning curves);
- :mod:`.compare`: several runs side by side;
- :mod:`.distill`: closed-form formulas fitted to a run's evolved function (``metarl
  distill``);
- :mod:`.kind`: the run kind the engine runs (:mod:`metarl.runs.engine`);
- :mod:`.metagradient_kind`: a meta-gradient run on the same engine and run directory;
- :mod:`.replicated`: ``es.evolution_seeds = N`` evolutions as one program, in a parent of
  ``N`` ordinary run directories, their resume and one verdict across them.

Start, continue, evaluate and draw runs through :mod:`metarl.kinds`.
"""
