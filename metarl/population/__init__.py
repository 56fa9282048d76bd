"""Run kinds that train a population of agents and edit it as it trains: population-based
training (:mod:`.pbt`) over hyperparameter priors (:mod:`.priors`); the cross-entropy
method of CEM-RL (:mod:`.cem`) and DvD's diversity term (:mod:`.diversity`), and the TD3
populations built on them: CEM-RL (:mod:`.cem_rl`) and DvD-TD3 (:mod:`.dvd`) with one shared
critic (:mod:`.shared_critic`), drawn by :mod:`.plots`."""
