"""``gunicorn geneva_drive.dashboard.wsgi:app``: the standalone dashboard and ``/metrics``,
configured from ``GENEVA_*`` environment variables."""

from geneva_drive import transport
from geneva_drive.dashboard import create_app

app = create_app()  # refuses an unset GENEVA_DATABASE_URL first
# Its operator actions schedule steps: never publish to a broker this process was not given
# (SPEC §6.6). Refused here, at start, naming GENEVA_BROKER_URL.
transport.require_publisher("the standalone dashboard (geneva_drive.dashboard.wsgi)")
