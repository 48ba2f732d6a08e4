"""``--env prod --kit KIT``: the job submitted to the consortium's deployment as the lead whose admin kit is given.

NVFlare's ``ProdEnv`` only checks that the kit's path exists: a site's or the server's kit fails after the job is
built ("fed_admin.json does not exist"), a server that does not answer says "cannot connect to server for 3.0
seconds" without naming it, and the user defaults to ``admin@nvidia.com``. So before anything is built the kit is
checked here, each refusal one line naming the kit (the kit and role checks are the sweep's own,
:mod:`feddg.benchmark.executors.flare`): a missing folder; a site's or the server's kit instead of an admin kit; an
admin kit whose role may not submit under the project's site policy (only leads submit); a server that does not
accept a connection on the kit's admin address within the bound (refused, or timed out). Then ``ProdEnv`` logs in
as the kit's own admin user.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from nvflare.recipe.prod_env import ProdEnv

from feddg.benchmark.executors.flare import AdminKit, check_role, read_admin_kit

CONNECT_TIMEOUT_S = 5.0  # the server's admin port must accept a connection within this (the checks' bound: 10 s)


def check_server(kit: AdminKit, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """ValueError (one line naming the kit, the host and the port) unless the server accepts a TCP connection on
    the kit's admin address within ``timeout`` seconds."""
    started = time.monotonic()
    try:
        with socket.create_connection((kit.host, kit.port), timeout=timeout):
            return
    except ConnectionRefusedError:
        why = "refused the connection (nothing listens there: is the server running?)"
    except (TimeoutError, socket.timeout):
        why = f"did not answer within {timeout:g} s (is it reachable from here?)"
    except OSError as e:  # no route, name not resolved, ...
        why = f"cannot be reached: {e.strerror or e} after {time.monotonic() - started:.1f} s"
    raise ValueError(f"--kit {kit.path}: the deployment's server {kit.host}:{kit.port} {why}")


def check_kit(kit: Path, timeout: float = CONNECT_TIMEOUT_S) -> AdminKit:
    """The admin kit at ``kit`` once it has passed every check (see the module docstring); ValueError (one line)
    for the first that fails."""
    admin = read_admin_kit(Path(kit))
    check_role(admin)
    check_server(admin, timeout)
    return admin


def prod_env(kit: Path, timeout: float = CONNECT_TIMEOUT_S) -> ProdEnv:
    """``ProdEnv`` for the checked admin kit ``kit``, logging in as its own admin user."""
    admin = check_kit(kit, timeout)
    return ProdEnv(startup_kit_location=str(admin.path), username=admin.user, login_timeout=timeout)
