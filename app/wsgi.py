"""``gunicorn geneva_drive.dashboard.wsgi:app``: the standalone dashboard and ``/metrics``,
configured from ``GENEVA_*`` environment variables."""

from geneva_drive import liveness, transport
from geneva_drive.dashboard import create_app

app = create_app()  # refuses an unset GENEVA_DATABASE_URL first
# Its operator actions schedule steps: never publish to a broker this process was not given
# (docs/MANUAL.md, "The command line in a host app"), nor to a queue no live worker consumes
# ("When a worker dies"). Refused here, at start, naming the setting.
transport.require_publisher("the standalone dashboard (geneva_drive.dashboard.wsgi)")
liveness.require_fed_queue("the standalone dashboard (geneva_drive.dashboard.wsgi)")
