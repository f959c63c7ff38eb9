"""`make run`'s demo: an operator, two tenants each with an admin, a key and their own adapters, uploaded through the
real upload path (the management API of the running web app) and validated by the Celery worker.

Idempotent: what exists is kept; the raw keys and passwords live in a state file (mode 600), since keys are only
ever shown once. The last lines printed are the credentials.
"""

import json
import secrets
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants import selectors, services
from tenants.models import Role, Tenant, TenantAPIKey

DEMO_TENANTS = [
    # slug, name, admin email, adapters (folders under demo/adapters/)
    ("acme", "Acme Robotics", "admin@acme.example", ["zorbania-facts", "pirate-persona"]),
    ("globex", "Globex", "admin@globex.example", ["json-extractor"]),
]
OPERATOR_EMAIL = "operator@example.com"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class Command(BaseCommand):
    help = "Seed the demo: an operator, two tenants with admins, keys and adapters (uploaded through the API)."

    def add_arguments(self, parser):
        parser.add_argument("--web-url", default="http://127.0.0.1:8000", help="the running web app")
        parser.add_argument("--adapters-dir", default=str(settings.BASE_DIR / "demo" / "adapters"))
        parser.add_argument("--state-file", default=str(settings.STATE_DIR / "demo.json"))
        parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for adapters to be ready")
        parser.add_argument("--no-adapters", action="store_true", help="accounts and keys only (no engine runs)")

    def handle(self, *args, web_url, adapters_dir, state_file, timeout, no_adapters, **options):
        state_path = Path(state_file)
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        state["operator"] = self._operator(state.get("operator"))
        for slug, name, email, _ in DEMO_TENANTS:
            state[slug] = self._tenant(slug, name, email, state.get(slug) or {})
        state_path.write_text(json.dumps(state, indent=2))
        state_path.chmod(0o600)
        try:
            for slug, _, _, adapters in [] if no_adapters else DEMO_TENANTS:
                for adapter in adapters:
                    self._upload(web_url, slug, state[slug]["key"], Path(adapters_dir) / adapter)
            for slug, _, _, adapters in [] if no_adapters else DEMO_TENANTS:
                for adapter in adapters:
                    self._wait_ready(web_url, slug, state[slug]["key"], adapter, timeout)
        finally:  # the accounts work whatever became of the adapters
            self._print(web_url, state)

    # ------------------------------------------------------------ accounts and keys

    def _operator(self, known: dict | None) -> dict:
        password = (known or {}).get("password") or secrets.token_urlsafe(12)
        User = get_user_model()
        user = User.objects.filter(username__iexact=OPERATOR_EMAIL).first()
        if user is None:
            user = services.user_create(email=OPERATOR_EMAIL, password=password, is_staff=True)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        return {"email": OPERATOR_EMAIL, "password": password}

    @transaction.atomic
    def _tenant(self, slug: str, name: str, email: str, known: dict) -> dict:
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(name=name, slug=slug)
        password = known.get("password") or secrets.token_urlsafe(12)
        User = get_user_model()
        user = User.objects.filter(username__iexact=email).first()
        if user is None:
            user = services.user_create(email=email, password=password)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        if selectors.tenant_role(tenant=tenant, user=user) is None:
            services.membership_add(tenant=tenant, user=user, role=Role.ADMIN)
        key = known.get("key")
        prefix = key.split(".", 1)[0] if key else None
        if not prefix or not TenantAPIKey.objects.filter(tenant=tenant, prefix=prefix, revoked=False).exists():
            _, key = services.api_key_create(tenant=tenant, name="demo", scopes=["inference", "manage"])
        return {"name": name, "admin": email, "password": password, "key": key}

    # ------------------------------------------------------------ adapters, through the real upload path

    def _upload(self, web_url: str, slug: str, key: str, folder: Path) -> None:
        if not all((folder / name).is_file() for name in ADAPTER_FILES):
            raise CommandError(f"{folder} is not a PEFT adapter folder ({', '.join(ADAPTER_FILES)})")
        base = f"{web_url}/api/tenants/{slug}/adapters/"
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            existing = http.get(f"{base}{folder.name}/")
            if existing.status_code == 200:
                self.stdout.write(f"[demo] {slug}/{folder.name}: already uploaded")
                return
            created = http.post(base, json={"name": folder.name, "description": "demo adapter"})
            if created.status_code not in (200, 201):
                raise CommandError(f"creating {slug}/{folder.name} failed: {created.status_code} {created.text}")
            with ExitStack() as stack:
                files = [("files", (name, stack.enter_context(open(folder / name, "rb")))) for name in ADAPTER_FILES]
                uploaded = http.post(f"{base}{folder.name}/versions/", files=files)
            if uploaded.status_code != 202:
                raise CommandError(f"uploading {slug}/{folder.name} failed: {uploaded.status_code} {uploaded.text}")
            self.stdout.write(f"[demo] {slug}/{folder.name}: uploaded, validating")

    def _wait_ready(self, web_url: str, slug: str, key: str, name: str, timeout: float) -> None:
        url = f"{web_url}/api/tenants/{slug}/adapters/{name}/versions/"
        deadline = time.monotonic() + timeout
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            while time.monotonic() < deadline:
                versions = http.get(url).json().get("results", [])
                statuses = {v["status"] for v in versions}
                if "ready" in statuses:
                    self.stdout.write(f"[demo] {slug}/{name}: ready")
                    return
                if statuses and statuses <= {"failed"}:
                    reasons = "; ".join(v.get("failure_reason") or "" for v in versions)
                    raise CommandError(f"{slug}/{name} failed validation: {reasons}")
                time.sleep(1)
        raise CommandError(f"{slug}/{name} was not ready within {timeout:.0f}s")

    def _print(self, web_url: str, state: dict) -> None:
        operator = state["operator"]
        self.stdout.write(f"  operator         {operator['email']} / {operator['password']}")
        for slug, _, _, adapters in DEMO_TENANTS:
            tenant = state[slug]
            self.stdout.write(f"  {slug:<16} {tenant['admin']} / {tenant['password']}   {web_url}/t/{slug}/")
            self.stdout.write(f"  {'':<16} API key {tenant['key']}   adapters: {', '.join(adapters)}")
