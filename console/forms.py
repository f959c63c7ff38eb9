"""Forms of the console: they parse and bound what a person typed; the rules live in tenants.services, whose
ValidationErrors `add_service_errors` puts back onto the form."""

from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from tenants.models import QUOTA_FIELDS, Quota, Role, Scope, Tenant
from tenants.priority import INTERACTIVE, MAX_FAIRNESS_WEIGHT, PRIORITY_CHOICES, PRIORITY_CODES, priority_name

MAX_RANGE_DAYS = 366
FIRST_DAY, LAST_DAY = date(2000, 1, 1), date(9000, 12, 31)  # room for the presets' and the queries' day arithmetic


def add_service_errors(form: forms.Form, error: ValidationError) -> None:
    """Show a service's ValidationError on the form: on the field it names when the form has it, else on top."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error.messages)
        return
    for field, messages in error.message_dict.items():
        form.add_error(field if field in form.fields else None, messages)


class APIKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=50, help_text="What the key is for, e.g. \u201cproduction backend\u201d.")
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, initial=[Scope.INFERENCE], widget=forms.CheckboxSelectMultiple,
        help_text="Inference calls the OpenAI-compatible API; manage calls the management API.",
    )
    adapter_names = forms.CharField(
        required=False, max_length=2000, label="Restrict to adapters",
        help_text="Comma-separated adapter names; leave empty to allow every adapter of the tenant.",
    )
    # A day (named as the service's field, so its errors land here); the key stops at its start, UTC.
    expires_at = forms.DateField(required=False, label="Expires on",
                                 widget=forms.DateInput(attrs={"type": "date"}),
                                 help_text="Optional. The key stops working at the start of this day (UTC).")
    priority = forms.TypedChoiceField(choices=PRIORITY_CHOICES, initial=INTERACTIVE, required=False,
                                      empty_value=INTERACTIVE,
                                      help_text="Batch requests are served after interactive ones when the "
                                                "engines are full: for jobs nobody waits on.")

    def clean_adapter_names(self) -> list[str]:
        return [name.strip() for name in self.cleaned_data["adapter_names"].split(",") if name.strip()]

    def expiry(self) -> datetime | None:
        day = self.cleaned_data.get("expires_at")
        return datetime.combine(day, time.min, tzinfo=UTC) if day else None


class InvitationForm(forms.Form):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberAddForm(forms.Form):
    """Operators add an existing account; people without one are invited."""

    email = forms.EmailField(label="Account email")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class InvitationAcceptForm(forms.Form):
    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))
    password_again = forms.CharField(label="Password (again)",
                                     widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))

    def clean(self):
        data = super().clean()
        if data.get("password") and data.get("password") != data.get("password_again"):
            self.add_error("password_again", "The two passwords differ.")
        return data


class TenantCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.CharField(max_length=50, required=False,
                           help_text="Optional: lowercase letters, digits and hyphens; made from the name if empty.")


class TenantSearchForm(forms.Form):
    q = forms.CharField(required=False, max_length=100, label="Search")
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *Tenant.Status.choices])


def _column_max(name: str) -> int:
    """The largest value the quota column holds (integer or big integer)."""
    big = isinstance(Quota._meta.get_field(name), models.PositiveBigIntegerField)
    return 2**63 - 1 if big else 2**31 - 1


class QuotaForm(forms.Form):
    """One optional value per quota field; empty means the platform default. Numbers, but for the priority class:
    its name here, its code (tenants.priority) in the quota."""

    LABELS = {
        "requests_per_minute": "Requests per minute",
        "tokens_per_minute": "Tokens per minute",
        "monthly_tokens": "Tokens per month",
        "max_concurrent_requests": "Concurrent requests",
        "default_max_tokens": "Default max_tokens",
        "max_tokens_limit": "Largest max_tokens",
        "max_adapters": "Adapters",
        "max_adapter_storage_bytes": "Adapter storage (bytes)",
        "fairness_weight": "Fairness weight",
        "priority_class": "Priority class",
    }
    MAX_VALUES = {"fairness_weight": MAX_FAIRNESS_WEIGHT}

    def __init__(self, *args, initial: dict | None = None, **kwargs):
        initial = dict(initial or {})
        if initial.get("priority_class") is not None:  # the tenant's stored code, shown as its name
            initial["priority_class"] = priority_name(initial["priority_class"])
        super().__init__(*args, initial=initial, **kwargs)
        defaults = settings.TENANT_QUOTA_DEFAULTS
        for name in QUOTA_FIELDS:
            if name == "priority_class":
                self.fields[name] = forms.TypedChoiceField(
                    required=False, choices=[("", "default"), *PRIORITY_CHOICES], coerce=PRIORITY_CODES.get,
                    empty_value=None, label=self.LABELS[name],
                    help_text=f"Platform default: {priority_name(defaults[name])}. Batch tenants are served after "
                              "interactive ones when the engines are full.",
                )
                continue
            self.fields[name] = forms.IntegerField(
                required=False, min_value=1, max_value=self.MAX_VALUES.get(name, _column_max(name)),
                label=self.LABELS[name], help_text=f"Platform default: {defaults[name]:,}. Leave empty to use it.",
                widget=forms.NumberInput(attrs={"placeholder": "default"}),
            )

    def changes(self) -> dict[str, int | None]:
        return {name: self.cleaned_data.get(name) for name in QUOTA_FIELDS}


class DateRangeForm(forms.Form):
    """A range of UTC days, at most MAX_RANGE_DAYS long; `default_days` back from today when not given."""

    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, default_since: date | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.today = timezone.now().astimezone(UTC).date()
        self.default_since = default_since or self.today - timedelta(days=29)

    def clean(self):
        data = super().clean()
        until = data.get("until") or self.today
        since = data.get("since") or min(self.default_since, until)
        if not FIRST_DAY <= since <= LAST_DAY or not FIRST_DAY <= until <= LAST_DAY:
            raise ValidationError(f"Choose days between {FIRST_DAY} and {LAST_DAY}.")
        if since > until:
            raise ValidationError("The first day must not be after the last day.")
        if (until - since).days + 1 > MAX_RANGE_DAYS:
            raise ValidationError(f"Choose at most {MAX_RANGE_DAYS} days.")
        data["since"], data["until"] = since, until
        return data

    def bounds(self) -> tuple[date, date]:
        """The chosen range when valid, else the default one."""
        if self.is_valid():
            return self.cleaned_data["since"], self.cleaned_data["until"]
        return self.default_since, self.today


class SchemaVersionForm(forms.Form):
    """A new version of a registered schema: the JSON Schema as text (schemas.documents checks it once parsed)."""

    schema = forms.CharField(label="JSON Schema", max_length=64 * 1024, strip=False,
                             widget=forms.Textarea(attrs={"rows": 12, "class": "mono", "spellcheck": "false"}),
                             help_text="A JSON object, at most 64 KiB and 32 levels deep.")
    description = forms.CharField(required=False, max_length=2000,
                                  help_text="Optional; sent as json_schema.description.")
    strict = forms.BooleanField(required=False, help_text="Sent as json_schema.strict (the engine enforces the "
                                                          "schema either way).")

    def clean_schema(self):
        import json

        try:
            return json.loads(self.cleaned_data["schema"])
        except ValueError as exc:
            raise ValidationError(f"Not valid JSON: {exc}") from None


class SchemaCreateForm(SchemaVersionForm):
    name = forms.CharField(max_length=64, help_text="Letters, digits, '_' or '-'; requests name it in "
                                                    "response_format.json_schema.name.")
    field_order = ["name", "schema", "description", "strict"]
