"""The whole system's settings as one typed tree (pydantic), one module per top-level YAML
section: ``experiment`` (the experiment kinds and their top-level scalars), ``actor`` (``actor``,
``ref``, ``critic``, ``model``), ``rollout`` (``rollout``, ``gconfig``, ``eval_gconfig``,
``reward_model``), ``workflow``, ``dataset`` (``train_dataset``, ``valid_dataset``),
``servers``, ``weights`` (``weight_update``), ``launcher``, ``run`` (``saver``, ``evaluator``,
``recover``, ``stats_logger``, ``cluster``); ``base`` holds the base model, ``loader`` reads
YAML and overrides. Import each class from the module that defines it: this file exports
nothing.
"""
