"""The configuration NeMo 1.x's megatron_gpt_pretraining.py receives from an emitted launch.sh
(run by bench/upstream_check.py with a Python that has hydra-core; imports nothing of this
project).

NeMo's script is `@hydra_runner(config_path="conf", config_name="megatron_gpt_config")`, a
wrapper of Hydra's own command-line handling: `--config-path/--config-name` select the primary
config, its defaults list is resolved over the search path, and key=value overrides are merged.
This stands in for the script with a Hydra app of the same decorator arguments, called with
exactly the arguments launch.sh hands over, and writes the composed configuration as JSON
(resolved), or the error Hydra raises. NeMo's model code is not run.

usage: python run_nemo.py RESULT.json SCRIPT-ARGS...
"""

import json
import sys

import hydra
from omegaconf import OmegaConf

DEST = sys.argv[1]


@hydra.main(version_base=None, config_path="conf", config_name="megatron_gpt_config")
def app(cfg):
    doc = OmegaConf.to_container(cfg, resolve=False)
    with open(DEST, "w") as f:
        json.dump({"accepted": True, "config": doc,
                   "missing_exp_manager": "exp_manager" not in cfg}, f, default=str)


if __name__ == "__main__":
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    try:
        app()
    except BaseException as e:  # Hydra errors, SystemExit
        if not isinstance(e, SystemExit) or e.code:
            with open(DEST, "w") as f:
                json.dump({"accepted": False, "error": f"{type(e).__name__}: {e}"[:600]}, f)
