"""The randomness that privacy rests on: the DP noise (the server's update and statistics noise,
adaptive clipping's count noise, DP-SGD's per-step noise) and the clients each round selects.

``privacy.randomness`` chooses its source:

- ``"seeded"``: every draw comes from a ``torch.Generator`` (numpy's for the selection) seeded from
  (run seed, stream, round, …) by :func:`~fedlatent.seeding.derive_seed`, as every other draw of the
  run. A run repeats to the bit, but anyone who holds the configuration (on Flower every node does)
  can regenerate the noise and the selection: subtracting a round's noise and its own update from
  the published global model, a participant recovers the other clients' updates, and the
  amplification by sampling the accountant counts does not hold against it. ε then holds only
  against observers who do not hold the run's seed; the run says so.
- ``"secret"``: a 32-byte key from the operating system's CSPRNG (:func:`secrets.token_bytes`)
  replaces the seed, and the draws come from SHAKE-256 (FIPS 202) of (key, stream, indices,
  counter), an extendable-output function used as a cryptographic generator (the construction
  SecAgg+'s masks use here, :func:`fedlatent.backends.flower.secagg.expand`). The key is server
  state (``Server.state[SECRET_KEY]``): a checkpoint keeps it so that a resumed run goes on with
  the same streams, and it is never part of what a client is sent (the payload). Each client's own
  draws (its batches and augmentation, FedALA's sample, MMD-D's kernels, its fine-tuning, its t-SNE
  sample, SecAgg+'s rounding) derive from its *stream seed* (:meth:`Randomness.client_seed`): the
  run seed in a seeded run, so that every number is the seeded run's; in a secret run a 63-bit
  stream of the key per client, which the server sends that client alone (on Flower, to the node
  serving it), so that no other party can compute them. The run seed of a secret run is then
  public (it fixes the data split and the initial model, which every node builds alike) and
  nothing private derives from it. DP-SGD's noise is
  the client's own: each client's generator of a round is keyed by fresh OS entropy, never stored
  (a round is atomic: a resumed run replays it with new noise, none of the old having been released).

Floating-point attacks: a Gaussian drawn by Box–Muller or the polar method in floating point takes
values on an irregular lattice, and an observer of x + noise can rule out the values of x whose
noise would not be representable (Mironov 2012, "On significance of the least significant bits
for differential privacy", for the Laplace mechanism; Holohan & Braghin 2021, "Secure random
sampling in differential privacy", for the Gaussian's samplers). As Opacus's ``secure_mode`` does
after Holohan & Braghin, each secret standard normal is the sum of four independent Box–Muller
draws divided by 2 (:func:`secure_normal`): the sum's values fill the lattice's gaps, and its law
stays N(0, 1). The draws are in float64 on 53-bit uniforms.
"""
from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass, field

import numpy as np
import torch

from fedlatent.config import PrivacyConfig
from fedlatent.seeding import CLIENT_SAMPLING, CLIENT_SEED, derive_seed

SEEDED, SECRET = "seeded", "secret"
MODES = ("auto", SECRET, SEEDED)
SECRET_KEY = "privacy.secret_key"  # the server state's entry of the secret key (uint8, 32 bytes)
KEY_BYTES = 32
_SUMMANDS = 4  # Box–Muller draws per secure normal (Opacus's secure_mode; Holohan & Braghin 2021)


def resolve(mode: str, backend: str, private: bool = True) -> str:
    """``privacy.randomness`` on ``backend``: ``"auto"`` is ``"secret"`` on Flower (the nodes hold the
    configuration) in a ``private`` run (noise > 0: a guarantee to protect) and ``"seeded"`` on the
    embedded backends (reproducible research) and in a run without noise; a choice made stays."""
    if mode != "auto":
        return mode
    return SECRET if backend == "flower" and private else SEEDED


def noised(privacy: PrivacyConfig) -> bool:
    """Whether ``privacy`` adds DP noise anywhere (client-level or sample-level)."""
    return privacy.noise_multiplier > 0 or privacy.sample_noise_multiplier > 0


class SecretStream:
    """A cryptographic generator: SHAKE-256 of (key, stream's indices, counter), one digest per draw
    and the counter moved after each, so that successive draws of one stream are independent."""

    def __init__(self, key: bytes, *indices: int) -> None:
        label = b"".join(int(i).to_bytes(8, "little", signed=False) for i in indices)
        self.key = hashlib.blake2b(label, key=key, digest_size=32).digest()
        self.counter = 0

    def bytes(self, n: int) -> bytes:
        """``n`` bytes of the stream's next draw."""
        out = hashlib.shake_256(self.key + self.counter.to_bytes(8, "little")).digest(n)
        self.counter += 1
        return out

    def uniform(self, n: int) -> np.ndarray:
        """``n`` uniforms in (0, 1), float64, each from 53 random bits: (k + ½) / 2⁵³."""
        words = np.frombuffer(self.bytes(8 * n), dtype="<u8") >> np.uint64(11)
        return (words.astype(np.float64) + 0.5) / 2.0 ** 53


def secure_normal(n: int, stream: SecretStream) -> np.ndarray:
    """``n`` standard normals, float64: each the sum of four Box–Muller normals over 2 (a sum of
    four N(0, 1) has variance 4), the defence against floating-point attacks of Opacus's
    ``secure_mode`` (Holohan & Braghin 2021)."""
    pairs = math.ceil(_SUMMANDS * n / 2)
    u = stream.uniform(2 * pairs)
    radius, angle = np.sqrt(-2.0 * np.log(u[:pairs])), 2.0 * math.pi * u[pairs:]
    draws = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:_SUMMANDS * n]
    return draws.reshape(_SUMMANDS, n).sum(0) / 2.0


Source = torch.Generator | SecretStream


def standard_normal(shape: tuple[int, ...] | torch.Size | int, source: Source,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """Standard normals of ``shape`` on the CPU from ``source``: ``torch.randn(shape, generator=source,
    dtype=dtype)`` for a seeded generator (today's draws, bit for bit), :func:`secure_normal` for a
    secret stream (in ``dtype``, torch's default when None)."""
    if isinstance(source, torch.Generator):
        return torch.randn(shape, generator=source, dtype=dtype)
    size = torch.Size([shape] if isinstance(shape, int) else shape)
    values = torch.from_numpy(secure_normal(size.numel(), source)).reshape(size)
    return values.to(dtype or torch.get_default_dtype())


def uniform(n: int, source: Source) -> torch.Tensor:
    """``n`` uniforms in [0, 1), float64, on the CPU from ``source``: ``torch.rand`` for a seeded
    generator, the stream's 53-bit uniforms for a secret one."""
    if isinstance(source, torch.Generator):
        return torch.rand(n, generator=source, dtype=torch.float64)
    return torch.from_numpy(source.uniform(n))


def poisson(rate: float, n: int, source: Source) -> torch.Tensor:
    """``n`` draws of Poisson(``rate``) (int64) from ``source``: ``torch.poisson`` for a seeded
    generator, :func:`secure_poisson` for a secret stream."""
    if isinstance(source, torch.Generator):
        return torch.poisson(torch.full((n,), rate, dtype=torch.float64), generator=source).to(torch.int64)
    return torch.from_numpy(secure_poisson(rate, n, source))


def secure_poisson(rate: float, n: int, stream: SecretStream) -> np.ndarray:
    """``n`` exact draws of Poisson(``rate``) (int64) from a secret stream's uniforms: for rate < 10
    Knuth's multiplication method (the count of uniforms whose running product stays above e^−rate),
    else Hörmann's transformed rejection PTRS (1993, "The transformed rejection method for generating
    Poisson random variables"; numpy's own sampler for rate ≥ 10), each vectorised over the draws
    still pending."""
    out = np.zeros(n, dtype=np.int64)
    pending = np.arange(n)
    if rate < 10:
        product, floor = np.ones(n), math.exp(-rate)
        while pending.size:
            product[pending] *= stream.uniform(pending.size)
            alive = product[pending] > floor
            out[pending[alive]] += 1
            pending = pending[alive]
        return out
    slam, loglam = math.sqrt(rate), math.log(rate)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_alpha, vr = math.log(1.1239 + 1.1328 / (b - 3.4)), 0.9277 - 3.6224 / (b - 2)
    while pending.size:
        u, v = stream.uniform(pending.size) - 0.5, stream.uniform(pending.size)
        us = 0.5 - np.abs(u)
        k = np.floor((2 * a / us + b) * u + rate + 0.43)
        quick = (us >= 0.07) & (v <= vr)
        possible = ~quick & (k >= 0) & ~((us < 0.013) & (v > us))
        log_gamma = torch.lgamma(torch.from_numpy(np.maximum(k, 0) + 1)).numpy()
        accepted = quick | (possible & (np.log(v) + log_alpha - np.log(a / (us * us) + b)
                                        <= -rate + k * loglam - log_gamma))
        out[pending[accepted]] = k[accepted].astype(np.int64)
        pending = pending[~accepted]
    return out


@dataclass
class Randomness:
    """A run's privacy randomness: ``mode`` ``"seeded"`` (from ``seed``) or ``"secret"`` (from ``key``,
    drawn from the OS when not given)."""

    mode: str
    seed: int
    key: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, privacy: PrivacyConfig, backend: str, seed: int) -> Randomness:
        """A run's: ``privacy.randomness`` resolved on ``backend`` (:func:`resolve`), from ``seed`` or a fresh key."""
        return cls(resolve(privacy.randomness, backend, noised(privacy)), seed)

    def __post_init__(self) -> None:
        if self.mode not in (SECRET, SEEDED):
            raise ValueError(f"Randomness mode {self.mode!r}: 'secret' or 'seeded'")
        if self.mode == SECRET and not self.key:
            self.key = secrets.token_bytes(KEY_BYTES)

    @property
    def secret(self) -> bool:
        return self.mode == SECRET

    def generator(self, stream: int, *indices: int) -> Source:
        """The source of stream ``stream`` (a :mod:`~fedlatent.seeding` purpose) at ``indices`` (round, …):
        the seeded ``torch.Generator`` of (seed, stream, indices), or the secret stream of the key."""
        if not self.secret:
            return torch.Generator().manual_seed(derive_seed(self.seed, stream, *indices))
        return SecretStream(self.key, stream, *indices)

    def client_seed(self, cid: int) -> int:
        """Client ``cid``'s stream seed, which its own draws derive from (``derive_seed(seed, PURPOSE,
        round, cid, …)``): the run seed (seeded), or 63 bits of the key's stream
        :data:`~fedlatent.seeding.CLIENT_SEED` at ``cid`` (secret), known to the server and that client alone."""
        if not self.secret:
            return self.seed
        return int.from_bytes(SecretStream(self.key, CLIENT_SEED, cid).bytes(8), "little") >> 1

    def select(self, rnd: int, num_clients: int, count: int) -> list[int]:
        """``count`` distinct clients of ``num_clients`` for round ``rnd``, in id order: the seeded
        draw of :func:`fedlatent.federated.round.sample_clients`, or the first ``count`` of a secret
        random permutation (the order of ``num_clients`` secret uniforms)."""
        if count >= num_clients:
            return list(range(num_clients))
        if not self.secret:
            rng = np.random.default_rng(derive_seed(self.seed, CLIENT_SAMPLING, rnd))
            return sorted(int(c) for c in rng.choice(num_clients, count, replace=False))
        order = np.argsort(SecretStream(self.key, CLIENT_SAMPLING, rnd).uniform(num_clients), kind="stable")
        return sorted(int(c) for c in order[:count])

    def poisson(self, rnd: int, num_clients: int, rate: float) -> list[int]:
        """Round ``rnd``'s Poisson sample: each of ``num_clients`` clients in independently with
        probability ``rate`` (``train.client_sampling = "poisson"``), in id order; possibly none."""
        if rate >= 1:
            return list(range(num_clients))
        if self.secret:
            draws = SecretStream(self.key, CLIENT_SAMPLING, rnd).uniform(num_clients)
        else:
            draws = np.random.default_rng(derive_seed(self.seed, CLIENT_SAMPLING, rnd)).random(num_clients)
        return [int(c) for c in np.flatnonzero(draws < rate)]

    def sample(self, rnd: int, num_clients: int, participation: float, scheme: str, count: int) -> list[int]:
        """Round ``rnd``'s clients under ``train.client_sampling`` = ``scheme``: ``count`` of them
        (:meth:`select`), or the Poisson sample of rate ``participation`` (:meth:`poisson`)."""
        if scheme == "poisson":
            return self.poisson(rnd, num_clients, participation)
        return self.select(rnd, num_clients, count)

    def bind(self, state: dict[str, torch.Tensor]) -> None:
        """Keep the secret key in the server ``state`` (a checkpoint's) or, where the state holds one
        already (a resumed run's), adopt it; a seeded run keeps nothing."""
        if not self.secret:
            return
        if SECRET_KEY in state:
            self.key = bytes(state[SECRET_KEY].to(torch.uint8).tolist())
        else:
            state[SECRET_KEY] = torch.tensor(list(self.key), dtype=torch.uint8)


def privacy_generator(seed: int | Randomness, stream: int, *indices: int) -> Source:
    """The generator of a privacy stream: from a :class:`Randomness`, its source; from a bare seed
    (the codecs built with an int, as before ``privacy.randomness``), the seeded ``torch.Generator``."""
    if isinstance(seed, Randomness):
        return seed.generator(stream, *indices)
    return torch.Generator().manual_seed(derive_seed(seed, stream, *indices))


def client_noise_source(secret: bool, seed: int, stream: int, *indices: int) -> Source:
    """A client's own noise source (DP-SGD's): seeded from (seed, stream, indices), or, ``secret``,
    a stream keyed by fresh OS entropy that no other party — the server included — holds."""
    if secret:
        return SecretStream(secrets.token_bytes(KEY_BYTES), stream, *indices)
    return torch.Generator().manual_seed(derive_seed(seed, stream, *indices))
