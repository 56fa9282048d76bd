"""Run kinds that train a population of agents and edit it as it trains: population-based
training (:mod:`.pbt`) over hyperparameter priors (:mod:`.priors`); the cross-entropy
method of CEM-RL (:mod:`.cem`) and DvD's diversity term (:mod:`.diversity`)."""
