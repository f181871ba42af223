"""Random number generation on mydev, mirroring torch.cuda.random.

Each device has a default generator. It draws from its own engine of the same
kind as the CPU generator, so the same seed gives the same numbers as on CPU,
while seeding or drawing on one never moves the other."""
from typing import Iterable, List, Union

import torch

from .. import _C

__all__ = [
    "default_generators", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
]


class _DefaultGenerators:
    def __getitem__(self, index: int) -> torch.Generator:
        return _C._default_generator(index)

    def __len__(self) -> int:
        return _C._device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def _generator(device=None) -> torch.Generator:
    from . import _get_device_index, _lazy_init

    _lazy_init()
    return default_generators[_get_device_index(device, optional=True)]


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for gen in default_generators:
        gen.manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    s = _generator(0).seed()
    for gen in list(default_generators)[1:]:
        gen.manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: Union[int, str, torch.device] = "mydev") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Union[int, str, torch.device] = "mydev") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> List[torch.Tensor]:
    return [gen.get_state() for gen in default_generators]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for gen, state in zip(default_generators, new_states):
        gen.set_state(state)
