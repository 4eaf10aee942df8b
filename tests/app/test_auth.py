"""Login, roles, demo mode, the host-app hook, and CSRF."""

from __future__ import annotations

import pytest

from geneva_drive.dashboard.auth import DashboardUser
from geneva_drive.workflow import Workflow
from tests.app.conftest import CSRF, post

ACTION_LABELS = [">Pause</button>", ">Resume</button>", ">Cancel</button>", ">Resume at</button>"]


def test_anonymous_visitor_is_sent_to_the_login(app):
    client = app.test_client()
    response = client.get("/workflows?state=paused")
    assert response.status_code == 302
    assert "/login?next=/workflows?state%3Dpaused" in response.headers["Location"]
    htmx = client.get("/workflows", headers={"HX-Request": "true"})
    assert htmx.status_code == 401
    assert htmx.headers["HX-Redirect"].startswith("/login")


def test_healthz_and_login_are_public(app):
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/login").status_code == 200


def _login_form(client, username: str, password: str, next_url: str = ""):
    client.get("/login")  # creates the session's CSRF token
    with client.session_transaction() as session:
        token = session["geneva_drive.csrf"]
    url = f"/login?next={next_url}" if next_url else "/login"
    return client.post(url, data={"username": username, "password": password, "csrf_token": token})


def test_login_with_the_configured_password_hash(app):
    client = app.test_client()
    bad = _login_form(client, "olga", "wrong")
    assert bad.status_code == 401
    assert "Unknown user or wrong password." in bad.get_data(as_text=True)
    assert _login_form(client, "ghost", "olga-pw").status_code == 401

    good = _login_form(client, "olga", "olga-pw", next_url="/audit")
    assert good.status_code == 302 and good.headers["Location"] == "/audit"
    page = client.get("/").get_data(as_text=True)
    assert "olga" in page and "operator" in page


def test_login_never_redirects_off_site(app):
    client = app.test_client()
    response = _login_form(client, "olga", "olga-pw", next_url="https://evil.example/")
    assert response.headers["Location"] == "/"
    response = _login_form(app.test_client(), "olga", "olga-pw", next_url="//evil.example/")
    assert response.headers["Location"] == "/"


def test_logout_clears_the_session(operator_client):
    assert post(operator_client, "/logout").status_code == 302
    assert operator_client.get("/").status_code == 302


def test_viewer_sees_no_action_controls(viewer_client, make_workflow):
    wf = make_workflow(run=True)
    detail = viewer_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "paused after" in detail
    for label in ACTION_LABELS:
        assert label not in detail
    assert "Send signal" not in detail
    listing = viewer_client.get("/workflows").get_data(as_text=True)
    assert "Pause selected" not in listing and 'name="ids"' not in listing
    assert "Resume selected at" not in viewer_client.get("/stranded").get_data(as_text=True)


@pytest.mark.parametrize("action", ["pause", "resume", "skip", "cancel", "reattempt", "resume_at"])
def test_viewer_posts_are_forbidden_and_change_nothing(
    viewer_client, make_workflow, geneva_session, action
):
    wf = make_workflow(run=True)
    response = post(viewer_client, f"/workflows/{wf.id}/{action}", {"step": "ship"})
    assert response.status_code == 403
    geneva_session.expire_all()
    assert geneva_session.get(Workflow, wf.id).state == "paused"


def test_viewer_cannot_signal_or_bulk(viewer_client, make_workflow):
    wf = make_workflow()
    assert post(viewer_client, f"/workflows/{wf.id}/signals", {"name": "x"}).status_code == 403
    bulk = post(viewer_client, "/workflows/bulk", {"action": "pause", "ids": str(wf.id)})
    assert bulk.status_code == 403


def test_post_without_csrf_token_is_400(operator_client, make_workflow, geneva_session):
    wf = make_workflow()
    response = operator_client.post(f"/workflows/{wf.id}/pause")
    assert response.status_code == 400
    assert "CSRF token is missing" in response.get_data(as_text=True)
    geneva_session.expire_all()
    assert geneva_session.get(Workflow, wf.id).state == "ready"


def test_post_with_a_wrong_csrf_token_is_403(operator_client, make_workflow, geneva_session):
    wf = make_workflow()
    response = operator_client.post(f"/workflows/{wf.id}/pause", headers={"X-CSRF-Token": "forged"})
    assert response.status_code == 403
    form = operator_client.post(f"/workflows/{wf.id}/pause", data={"csrf_token": "forged"})
    assert form.status_code == 403
    geneva_session.expire_all()
    assert geneva_session.get(Workflow, wf.id).state == "ready"


def test_csrf_token_in_the_form_field_works_without_htmx(operator_client, make_workflow):
    wf = make_workflow()
    response = operator_client.post(f"/workflows/{wf.id}/pause", data={"csrf_token": CSRF})
    assert response.status_code == 302


def test_cross_site_request_is_refused_even_with_a_token(operator_client, make_workflow):
    wf = make_workflow()
    response = operator_client.post(
        f"/workflows/{wf.id}/pause",
        headers={"X-CSRF-Token": CSRF, "Sec-Fetch-Site": "cross-site"},
    )
    assert response.status_code == 403


def test_pages_carry_the_token_for_htmx(operator_client):
    html = operator_client.get("/").get_data(as_text=True)
    assert f'hx-headers=\'{{"X-CSRF-Token": "{CSRF}"}}\'' in html


def test_demo_mode_opens_loopback_as_operator_demo(app_factory, make_workflow):
    app = app_factory(DEMO=True)
    client = app.test_client()
    page = client.get("/")
    assert page.status_code == 200
    assert "demo" in page.get_data(as_text=True)
    wf = make_workflow()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    assert post(client, f"/workflows/{wf.id}/pause").status_code == 302


def test_demo_mode_still_requires_a_login_from_other_addresses(app_factory):
    app = app_factory(DEMO=True)
    client = app.test_client()
    response = client.get("/", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_host_application_login_hook(app_factory, make_workflow):
    def loader(request):
        if request.headers.get("X-Host-User") == "hana":
            return DashboardUser("hana", "viewer")
        return None

    app = app_factory(USER_LOADER=loader)
    client = app.test_client()
    assert client.get("/").status_code == 302
    page = client.get("/", headers={"X-Host-User": "hana"})
    assert page.status_code == 200 and "hana" in page.get_data(as_text=True)
    wf = make_workflow()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    forbidden = client.post(
        f"/workflows/{wf.id}/pause", headers={"X-Host-User": "hana", "X-CSRF-Token": CSRF}
    )
    assert forbidden.status_code == 403


def test_host_login_hook_by_dotted_path(app_factory):
    app = app_factory(USER_LOADER="tests.app.test_auth:always_operator")
    assert app.test_client().get("/").status_code == 200


def always_operator(request):
    return DashboardUser("hook-op", "operator")


def test_unknown_role_is_rejected():
    with pytest.raises(ValueError, match="Unknown dashboard role"):
        DashboardUser("x", "admin")


def test_a_user_removed_from_configuration_loses_access(app, operator_client):
    app.config["USERS"] = {}
    assert operator_client.get("/").status_code == 302
