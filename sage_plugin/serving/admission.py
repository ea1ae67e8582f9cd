"""What a speculative regime pays in admissions that a decode step's price misses, per output token.

Under continuous batching a finished request's slot is refilled by a prefill pass that every running request waits
for.  Requests decoded without speculation advance in lockstep and, when their lengths agree, finish together, so
their successors are admitted together; speculative requests finish at different steps and are admitted a few at a
time, so the same tokens cost more prefill passes.  The tier chooser prices a step by its own time; this adds the
admission time per token that each regime has been seen to pay.

:class:`AdmissionPrice` cuts the decode steps into windows of ``window`` steps.  A window whose steps were at least
``purity`` drafted counts for the drafted regime, one at least ``purity`` off for the off regime, a mixed one for
neither; each regime keeps the prefill seconds and the output tokens of its windows, decaying by ``1 - 1 / memory``
per window of that regime.  Its price is seconds per token, and a regime is priced only once both regimes have
``min_windows`` windows (before that, and for a runtime that never reports a prefill, both prices are 0: nothing
changes).  The chooser then rates a step of ``T`` tokens and ``S`` seconds as ``T / (S + T a)``.

The sums are kept per *load*, the largest batch size of the window (with the decode steps' batch sizes known;
else one load), and a step at batch size ``B`` is priced from the smallest load at or above ``B`` where both
regimes were seen (0 where there is none).  A prefill pass costs less per token at a larger load (a pass admits
more requests) and a regime is chosen mostly at some loads (drafted at one client, off at sixteen), so prices
pooled over every load would compare one regime's one-client admissions with the other's sixteen-client ones:
measured, drafted 1.45 ms a token against off 0.19 at four clients after a server had drafted at one client and
gone off at sixteen, which turned speculation off at four where it served 1.1x plain.

Only admissions that *refill* the batch are charged.  A prefill pass that grows the batch past the size the last
refill brought it to (the initial fill, arrivals into a batch with free slots) is the load's, paid whatever the
regime, and charging it to the regime of its window would price that regime by when the load arrived: at start-up the
first batch sizes are new to the tier chooser, which measures the off tier first there, so a server's whole initial
fill would land in off windows.  With the decode steps' batch sizes known (:meth:`AdmissionPrice.step`'s
``batch_size``), a pass that admits ``a`` requests after ``f`` finished (the refilled size less the size before the
pass) is charged ``min(f, a) / a`` of its seconds.

Worked example: 16 closed-loop clients, 64-token answers.  Off, the 16 requests finish in the same step and are
admitted by 2 prefill passes of 80 ms per 16 x 64 tokens: 0.16 s / 1024 = 0.16 ms a token.  Drafted, they finish
over many steps and are admitted by 6 passes: 0.47 ms a token.  A drafted step of 16 x 1.5 tokens in 140 ms then
rates 24 / (0.140 + 24 x 0.00047) = 159 tokens/s instead of 171; an off step of 16 tokens in 96 ms 16 / (0.096 + 16 x
0.00016) = 162 tokens/s: off wins.  Where lengths differ (requests stop at EOS), plain decoding staggers too, both
regimes pay alike and the prices cancel.

Host-side floats only: fed from host timings (with tensor parallelism, rank 0's, shared by the runtime) and host
accept counts, so every rank prices alike.
"""

from __future__ import annotations

__all__ = ["AdmissionPrice"]

DRAFTED, OFF = True, False


class AdmissionPrice:
    """Admission seconds per output token of the drafted and the off regime (module docstring).

    Args:
        window: decode steps per window.
        purity: the share of a window's steps one regime must hold for the window to count for it.
        memory: windows of a regime over which its sums decay by a factor ``e``.
        min_windows: windows (decayed count) each regime needs before either is priced.
    """

    def __init__(self, window: int = 32, purity: float = 0.75, memory: int = 16, min_windows: float = 2.0) -> None:
        if window < 1 or not 0.5 < purity <= 1.0 or memory < 1 or min_windows < 0:
            raise ValueError("window >= 1, purity in (0.5, 1], memory >= 1, min_windows >= 0")
        self.window, self.purity, self.min_windows = window, purity, min_windows
        self._decay = 1.0 - 1.0 / memory
        # (regime, load) -> [prefill s, tokens, windows]
        self._sums: dict[tuple[bool, int], list[float]] = {}
        self._open = [0, 0, 0.0, 0, 0]  # this window: steps, drafted steps, prefill seconds, tokens, load
        self._pending = 0.0  # prefill seconds since the last decode step, charged once its batch size is known
        self._before = 0  # the batch size of the last decode step before those passes
        self._size = 0  # the batch size of the last decode step
        self._refilled = 0  # the batch size the last prefill passes brought the batch to

    def prefill(self, seconds: float) -> None:
        """A prefill pass took ``seconds`` (admitting requests into the running batch)."""
        if self._pending == 0.0:
            self._before = self._size
        self._pending += max(seconds, 0.0)

    def step(self, drafted: bool, tokens: int, batch_size: int | None = None) -> None:
        """A decode step's feedback: whether it drafted, the output tokens it produced (every request's) and its batch
        size (None: unknown, the prefill passes before it are charged whole)."""
        if self._pending:
            self._open[2] += self._pending * self._refill_share(batch_size)
            self._pending = 0.0
            self._refilled = batch_size or 0
        if batch_size is not None:
            self._size = batch_size
        w = self._open
        w[4] = max(w[4], batch_size or 0)
        w[0] += 1
        w[1] += int(drafted)
        w[3] += tokens
        if w[0] < self.window:
            return
        share = w[1] / w[0]
        regime = DRAFTED if share >= self.purity else OFF if 1.0 - share >= self.purity else None
        if regime is not None and w[3] > 0:
            s = self._sums.setdefault((regime, w[4]), [0.0, 0.0, 0.0])
            s[:] = [s[0] * self._decay + w[2], s[1] * self._decay + w[3], s[2] * self._decay + 1.0]
        self._open = [0, 0, 0.0, 0, 0]

    def _refill_share(self, batch_size: int | None) -> float:
        """The share of the pending passes' seconds that refilled finished requests' slots (module docstring)."""
        admitted = None if batch_size is None else batch_size - self._before
        if admitted is None or admitted <= 0:
            return 1.0
        finished = max(self._refilled - self._before, 0)
        return min(finished, admitted) / admitted

    def load(self, batch_size: int | None = None) -> int | None:
        """The load that prices a step at ``batch_size``: the smallest at or above it where both regimes have
        ``min_windows`` windows (None: no such load; ``batch_size`` None: any load; load 0, a runtime that does not
        report batch sizes, prices every size)."""
        both = [
            ld for (r, ld), s in self._sums.items()
            if r == DRAFTED and (OFF, ld) in self._sums and min(s[2], self._sums[OFF, ld][2]) >= self.min_windows
            and (batch_size is None or ld >= batch_size or ld == 0)  # 0: sizes not reported
        ]  # fmt: skip
        return min(both) if both else None

    def per_token(self, drafted: bool, batch_size: int | None = None) -> float:
        """Admission seconds per output token of the regime at ``batch_size``'s load (0 until both regimes are
        measured there)."""
        load = self.load(batch_size)
        if load is None:
            return 0.0
        seconds, tokens, _ = self._sums[drafted, load]
        return seconds / tokens

    def summary(self) -> dict[str, float | None]:
        """Milliseconds of admission per token of each regime at each load (``admission_ms_per_token_drafted@16``)."""
        return {
            f"admission_ms_per_token_{'drafted' if r else 'off'}@{ld}": round(1000.0 * s[0] / s[1], 4)
            for (r, ld), s in sorted(self._sums.items(), key=lambda kv: (kv[0][1], not kv[0][0]))
            if s[1]
        }
