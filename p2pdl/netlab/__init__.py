"""An emulated internet on one Linux machine: namespaces, NAT gateways, bandwidth caps.

For tests, benchmarks and simulated swarms that need peers behind real NATs
and on capped links.  Needs root and ``ip``/``tc``/``nft``; models bandwidth
and NAT only (this kernel has no ``netem``: no delay or loss).  Imports
nothing from p2pdl but its errors; docs/netlab.md is the guide.

* :class:`Internet` (``_topology.py``) -- one lab: a bridge in its own
  namespace as the internet; :meth:`~Internet.add_public_host`,
  :meth:`~Internet.add_nat`, :meth:`~Internet.add_private_host`; removes
  everything on close.
* :class:`Host`, :class:`NatGateway` (``_host.py``) -- a namespace to run
  programs in: ``run``, ``popen``, trio's ``open_process``, ``command``.
* :class:`NatType` (``_nat.py``) -- how a gateway maps and filters, and so
  whether hole punching through it works; its nftables ruleset.
* :class:`Rate` (``_shaping.py``) -- bandwidth caps: tbf on egress, IFB + tbf
  on ingress.
* :func:`measure_throughput` (``_measure.py``) -- one timed bulk TCP transfer
  between two machines, to check what a link really carries.
* :func:`cleanup` (``_cleanup.py``) -- remove leftovers of runs whose process
  died; ``_processes.py`` stops the processes inside a lab first.
* :func:`available`, :func:`check`, :func:`require` (``_probe.py``) -- can the
  lab run here, and if not, why.
* ``_names.py`` -- run ids, namespace names (``p2nl-<run>-<host>``), owner
  records; ``_commands.py`` -- the subprocess runner (every call has a
  timeout); ``_errors.py`` -- :class:`NetlabError`, :class:`NetlabUnavailable`;
  ``cli.py`` -- ``python -m p2pdl.netlab check|up|list|cleanup``.
"""

from ._cleanup import cleanup as cleanup
from ._cleanup import runs_present as runs_present
from ._errors import NetlabError as NetlabError
from ._errors import NetlabUnavailable as NetlabUnavailable
from ._host import Host as Host
from ._host import Namespace as Namespace
from ._host import NatGateway as NatGateway
from ._measure import Throughput as Throughput
from ._measure import measure_throughput as measure_throughput
from ._names import TAG as TAG
from ._nat import NatType as NatType
from ._probe import Facility as Facility
from ._probe import available as available
from ._probe import check as check
from ._probe import require as require
from ._shaping import Rate as Rate
from ._topology import DEFAULT_LAN_NET as DEFAULT_LAN_NET
from ._topology import DEFAULT_PUBLIC_NET as DEFAULT_PUBLIC_NET
from ._topology import Internet as Internet
