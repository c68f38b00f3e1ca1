"""Butterfly all-reduce (``/p2pdl/allreduce/1.0.0``, ``node.allreduce``): the members of
a group average their tensors, each reducing one part (protocols/allreduce.md,
docs/allreduce.md).

Modules:

* ``config`` -- :class:`AllReduceConfig` (documented defaults) and the hard
  limits of chunks and timeouts.
* ``_messages`` -- the protocol: begin, done, reject, and after the round
  have, check, dispute and proof; the chunks travel as TENSOR frames.
* ``_state`` -- sans-IO: the :class:`Layout` of parts and chunks every member
  computes, the post-round exchange (who dials whom, what a member does with
  the parts others lack), the results.
* ``_parts`` -- sans-IO: one part's :class:`PartReducer` (held chunks, weights
  bounded by evidence and by :func:`cap_shares`, exclusions, averages chunk
  by chunk) and :class:`PartReceiver` (the averages arriving, checked).
* ``_weights`` -- sans-IO: the weight caps every reducer applies
  (:func:`cap_to_median`, :func:`cap_shares`), which verifiers check.
* ``_verify`` -- sans-IO: checking a reducer's result from its contributors'
  sketches, and its claimed weights against the caps (:class:`RoundVerifier`,
  :func:`check_part`); the round's joint nonce, committed, revealed and
  joined (:class:`JointNonce`); the buffers kept from round to round
  (:class:`Scratch`).
* ``_evidence`` -- sans-IO: what settles a dispute over a failed check: the
  senders' signed commitments, signed reports, the reducers' signed
  results, and what a reducer keeps and shows (:class:`ReducerEvidence`).
* ``_accusations`` -- sans-IO: proofs that travel (a reducer's two signed
  results of one part: :class:`Equivocation`; claims of disputes' proofs:
  :class:`DisputeClaim`), the record members publish in certificate runs
  and :class:`AccusationBoard`.
* ``_proofs`` -- sans-IO: a dispute's proof as anyone can judge it (every
  signature and binding checked, then the verdict reached again from the
  committed chunks: :func:`check_header`, :func:`judge`), and the proofs a
  node keeps to serve (:class:`KeptProofs`).
* ``_service`` -- :class:`AllReduceService`: the streams of a butterfly
  all-reduce, sending, reducing and receiving at once; each sender's weight
  bounded by what its progress reports support (``weight_evidence``), the
  one it attaches to its ``ar.begin`` (``own_report``) included.  Its
  sides, each a part of the class: ``_sending`` (the sender's streams and
  commitments), ``_reducing`` (a reducer's streams), ``_exchange`` (the
  post-round exchange: haves, secrets, joint nonces, reports),
  ``_disputes`` (verification and disputes) and ``_accusing`` (publishing
  and reading accusations, fetching and serving disputes' proofs); and
  ``_session``, what one call is while it runs, its statistics and flags.
"""

from ._messages import ALLREDUCE_PROTOCOL_ID as ALLREDUCE_PROTOCOL_ID
from ._parts import PartReceiver as PartReceiver
from ._parts import PartReducer as PartReducer
from ._service import OUTLIER_FLAG as OUTLIER_FLAG
from ._service import WEIGHT_FLAG as WEIGHT_FLAG
from ._service import AllReduceService as AllReduceService
from ._service import AllReduceStatistics as AllReduceStatistics
from ._service import OwnReport as OwnReport
from ._service import WeightEvidence as WeightEvidence
from ._state import AllReduceResult as AllReduceResult
from ._state import Contribution as Contribution
from ._state import Layout as Layout
from ._state import PartResult as PartResult
from ._state import default_fractions as default_fractions
from ._weights import cap_shares as cap_shares
from ._weights import cap_to_median as cap_to_median
from .config import AllReduceConfig as AllReduceConfig
