"""A Hydra config source that counts compositions (tests/component/test_sweeps.py): `hydra.searchpath=[probe://DIR]`
serves DIR like file:// and appends a line to $SWIFTSLURM_COMPOSE_LOG each time a config is loaded from it.
Hydra caches loads within one composition only, so a config chosen on the command line (`+probe=count`) is
loaded once per composition: the log's length is the number of compositions."""

import os

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.plugins.config_source import ConfigResult


class ComposeProbeSource(FileConfigSource):
    @staticmethod
    def scheme() -> str:
        return "probe"

    def load_config(self, config_path: str) -> ConfigResult:
        with open(os.environ["SWIFTSLURM_COMPOSE_LOG"], "a") as log:
            log.write(f"{config_path}\n")
        return super().load_config(config_path)
