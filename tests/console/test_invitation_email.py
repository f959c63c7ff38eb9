"""Invitations reach the invitee by email (Django's mail outbox here), from the console and from the API, once the
invitation is committed; an invitation revoked or used before its email goes out is not sent, and a mail server
that fails is retried."""

import smtplib

import pytest
from django.core import mail
from django.urls import reverse

from tenants import services, tasks
from tenants.models import Role
from tests.tenants.conftest import client_for  # noqa: F401 - the API clients (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def sending(monkeypatch):
    """Run the email task in-process when the invitation commits."""
    monkeypatch.setattr(tasks.invitation_email, "delay", lambda *args: tasks.invitation_email.apply(args=args))


def test_a_console_invitation_is_emailed_with_its_link(cast, client_as, sending, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("owner").post(reverse("console:tenant-invite", args=[cast.tenant.slug]),
                                           {"email": "New@Example.com", "role": "admin"})
    link = response.context["invitation_link"]
    (message,) = mail.outbox
    assert message.to == ["new@example.com"] and cast.tenant.name in message.subject
    assert link in message.body and cast.owner.email in message.body and "admin" in message.body
    assert "emailed" in response.content.decode()


def test_an_api_invitation_is_emailed_with_a_link_that_joins(cast, client_for, client, sending,  # noqa: F811
                                                             django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        created = client_for("owner").post(f"/api/tenants/{cast.tenant.slug}/invitations/",
                                           {"email": "joiner@example.com", "role": "member"}, format="json").json()
    (message,) = mail.outbox
    link = next(line for line in message.body.splitlines() if line.startswith("http"))
    assert link == f"http://testserver/invite/{created['token']}/"
    assert client.get(link.removeprefix("http://testserver")).status_code == 200  # the console's accept page


def test_an_invitation_revoked_or_used_before_its_email_is_not_sent(cast):
    revoked, _ = services.invitation_create(tenant=cast.tenant, email="a@example.com", role=Role.MEMBER,
                                            invited_by=cast.owner)
    services.invitation_revoke(tenant=cast.tenant, invitation=revoked)
    used, token = services.invitation_create(tenant=cast.tenant, email="b@example.com", role=Role.MEMBER,
                                             invited_by=cast.owner)
    services.invitation_accept(token=token, user=cast.outsider)
    assert tasks.invitation_email.apply(args=[revoked.pk, "http://x/"]).get() is False
    assert tasks.invitation_email.apply(args=[used.pk, "http://x/"]).get() is False
    assert mail.outbox == []


def test_a_failing_mail_server_is_retried(cast, monkeypatch):
    invitation, _ = services.invitation_create(tenant=cast.tenant, email="c@example.com", role=Role.MEMBER,
                                               invited_by=cast.owner)

    attempts = []

    def refuse(**kwargs):
        attempts.append(kwargs["recipient_list"])
        raise smtplib.SMTPServerDisconnected("connection unexpectedly closed")

    monkeypatch.setattr(services.tenants, "send_mail", refuse)
    result = tasks.invitation_email.apply(args=[invitation.pk, "http://x/"])  # in-process, retries run at once
    assert len(attempts) == 1 + tasks.invitation_email.max_retries and result.state == "FAILURE"
    assert mail.outbox == []
