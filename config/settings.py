"""The one settings module, driven by environment variables (see README "Configuration").

With DEBUG on, embedded defaults let `make run` work on a fresh machine; with DEBUG off (production) every
secret must be given and the deployment checks of `manage.py check --deploy` pass.
"""

from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int, env_list, env_str, env_url, env_url_list
from tenants.priority import MAX_FAIRNESS_WEIGHT, priority_code

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(env_str("PLATFORM_STATE_DIR", str(BASE_DIR / ".state")))

DEBUG = env_bool("DEBUG", False)

_DEV_SECRET = "dev-only-insecure-secret-key-never-use-in-production-0123456789"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET if DEBUG else None)
if not DEBUG and (SECRET_KEY == _DEV_SECRET or len(SECRET_KEY) < 50):
    raise ImproperlyConfigured("SECRET_KEY must be a random string of at least 50 characters when DEBUG is off")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost" if DEBUG else "")
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework_api_key",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from here, not from a CDN
    "drf_standardized_errors",
    "tenants",
    "adapters",
    "schemas",
    "gateway",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
CSRF_FAILURE_VIEW = "gateway.views.csrf_failure"  # OpenAI-shaped JSON under /v1/, Django's page elsewhere
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_url("DATABASE_URL", f"sqlite:///{STATE_DIR / 'db.sqlite3'}", schemes=("postgres", "postgresql", "sqlite")),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Writers queue for the lock (up to 20 s) instead of failing with "database is locked": a deferred
    # transaction that reads before it writes cannot wait for the lock, an immediate one can.
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20,
                                       "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
else:
    # A server that cannot be reached fails a connection in seconds, and a peer gone silent (host down, network
    # cut) is noticed by TCP instead of a query waiting on it for good. Options given in the URL win.
    DATABASES["default"]["OPTIONS"] = {
        "connect_timeout": env_int("DATABASE_CONNECT_TIMEOUT_S", 5, minimum=1),
        "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
        "tcp_user_timeout": 30_000, **DATABASES["default"].get("OPTIONS", {})}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = ["tenants.login_throttle.ThrottledModelBackend"]
# Failed sign-ins allowed per account (and per client address) within LOGIN_LOCKOUT_S before both are refused.
LOGIN_FAILURES_PER_ACCOUNT = env_int("LOGIN_FAILURES_PER_ACCOUNT", 10, minimum=1)
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 50, minimum=1)
LOGIN_LOCKOUT_S = env_int("LOGIN_LOCKOUT_S", 900, minimum=1)
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "console:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(STATE_DIR / "staticfiles")))

# --- Redis (Celery broker, quota counters, key-revocation pub/sub) ---
REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:6379/0", schemes=("redis", "rediss", "unix"))
# Connections per event loop of a gateway process to REDIS_URL (quota scripts, key-cache generation).
REDIS_POOL_SIZE = env_int("REDIS_POOL_SIZE", 64, minimum=1)
# Longest wait for Redis to connect or answer one command in a gateway process; past it the request gets a 503.
REDIS_TIMEOUT_S = env_int("REDIS_TIMEOUT_S", 2, minimum=1)
CELERY_BROKER_URL = env_url("CELERY_BROKER_URL", REDIS_URL, schemes=("redis", "rediss", "unix", "amqp"))
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}

# --- Email (invitations). Without EMAIL_HOST, messages go to the Celery worker's log (the console backend).
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_BACKEND = ("django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST
                 else "django.core.mail.backends.console.EmailBackend")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "LoRA platform <noreply@localhost>")

# --- Object store (adapters). The public endpoint is what browsers reach for presigned uploads. ---
S3_ENDPOINT_URL = env_url("S3_ENDPOINT_URL", "http://127.0.0.1:8333", schemes=("http", "https"))
S3_PUBLIC_ENDPOINT_URL = env_url("S3_PUBLIC_ENDPOINT_URL", S3_ENDPOINT_URL, schemes=("http", "https"))
S3_BUCKET = env_str("S3_BUCKET", "lora-adapters")
S3_REGION = env_str("S3_REGION", "us-east-1")
# Longest wait for one answer of the object store (each call tries twice at most).
S3_TIMEOUT_S = env_int("S3_TIMEOUT_S", 10, minimum=1)
AWS_ACCESS_KEY_ID = env_str("AWS_ACCESS_KEY_ID", "platform-dev-access" if DEBUG else None)
AWS_SECRET_ACCESS_KEY = env_str("AWS_SECRET_ACCESS_KEY", "platform-dev-secret-0123456789" if DEBUG else None)

# --- Engines (internal OpenAI-compatible servers, ENGINE_PROTOCOL.md) ---
ENGINE_URLS = env_url_list("ENGINE_URLS", "http://127.0.0.1:8100", schemes=("http", "https"))
ENGINE_API_KEY = env_str("ENGINE_API_KEY", "platform-dev-engine-key" if DEBUG else None)
BASE_MODEL_NAME = env_str("BASE_MODEL_NAME", "smollm2-135m-instruct")
# The served base model's config.json, for control-plane hosts without the model folder (else it is found
# through engine.models.prepare.resolve_model(BASE_MODEL_NAME)). Adapters are checked against its fingerprint.
BASE_MODEL_CONFIG = env_str("BASE_MODEL_CONFIG", "")
MAX_LORA_RANK = env_int("MAX_LORA_RANK", 64, minimum=1, maximum=512)

# --- Inference gateway (/v1): how it reaches the engines ---
# Replica health and load (/health and /stats) are re-read this often; requests use the last known state meanwhile.
GATEWAY_HEALTH_TTL_MS = env_int("GATEWAY_HEALTH_TTL_MS", 1000, minimum=50)
GATEWAY_ENGINE_CONNECT_TIMEOUT_MS = env_int("GATEWAY_ENGINE_CONNECT_TIMEOUT_MS", 2000, minimum=10)
# The longest an engine may stay silent: before its first byte (queueing, prefill) and between two chunks.
GATEWAY_ENGINE_READ_TIMEOUT_S = env_int("GATEWAY_ENGINE_READ_TIMEOUT_S", 120, minimum=1)
# Connections per event loop of a gateway process to all engines together (one per open stream).
GATEWAY_MAX_ENGINE_CONNECTIONS = env_int("GATEWAY_MAX_ENGINE_CONNECTIONS", 1024, minimum=1)
# The longest a gateway database query (usage row, adapter or key lookup) may take before the request it serves gives
# up on it (503, or the usage row is kept and written later).
GATEWAY_DB_TIMEOUT_S = env_int("GATEWAY_DB_TIMEOUT_S", 5, minimum=1)
# Usage rows and settles a stopping gateway process could not hand over (database or Redis down) are kept here and
# replayed by the next process to start (gateway.spool).
GATEWAY_SPOOL_DIR = env_str("GATEWAY_SPOOL_DIR", str(STATE_DIR / "gateway-spool"))
# Bearer token Prometheus must send to GET /metrics; empty: the endpoint is open (keep it off the public proxy).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# --- Adapter registry ---
# Validation ends with a load and a short generation on one engine. On by default whenever engines are
# configured; an explicit ENGINE_URLS="" (no engines) turns it off unless asked for, which is then an error.
ADAPTER_WARM_LOAD = env_bool("ADAPTER_WARM_LOAD", bool(ENGINE_URLS))
if ADAPTER_WARM_LOAD and not ENGINE_URLS:
    raise ImproperlyConfigured("ADAPTER_WARM_LOAD needs at least one engine in ENGINE_URLS")
ADAPTER_WARM_LOAD_TIMEOUT_S = env_int("ADAPTER_WARM_LOAD_TIMEOUT_S", 60, minimum=1)
# The largest upload accepted at all (a tenant's remaining storage quota may lower it).
ADAPTER_MAX_UPLOAD_BYTES = env_int("ADAPTER_MAX_UPLOAD_BYTES", 512 * 1024**2, minimum=1024)
# Part size of multipart uploads (S3 needs >= 5 MiB for every part but the last).
ADAPTER_UPLOAD_PART_BYTES = env_int("ADAPTER_UPLOAD_PART_BYTES", 8 * 1024**2, minimum=5 * 1024**2)
# How long presigned upload URLs (and the upload they belong to) stay valid.
ADAPTER_UPLOAD_TTL_S = env_int("ADAPTER_UPLOAD_TTL_S", 3600, minimum=60, maximum=7 * 24 * 3600)
# Attempts of a validation or purge task on transient object-store or engine errors before it gives up.
ADAPTER_TASK_MAX_RETRIES = env_int("ADAPTER_TASK_MAX_RETRIES", 8, minimum=0)

# --- Tenants: platform default quotas (each tenant may override), key cache, usage retention ---
try:  # a tenant's class is stored as a code (tenants.priority); the variable takes its name
    _DEFAULT_PRIORITY_CLASS = priority_code(env_str("QUOTA_DEFAULT_PRIORITY_CLASS", "interactive"))
except ValueError as exc:
    raise ImproperlyConfigured(f"QUOTA_DEFAULT_PRIORITY_CLASS: {exc}") from None
TENANT_QUOTA_DEFAULTS = {
    "requests_per_minute": env_int("QUOTA_DEFAULT_REQUESTS_PER_MINUTE", 60, minimum=1),
    "tokens_per_minute": env_int("QUOTA_DEFAULT_TOKENS_PER_MINUTE", 100_000, minimum=1),
    "monthly_tokens": env_int("QUOTA_DEFAULT_MONTHLY_TOKENS", 10_000_000, minimum=1),
    "max_concurrent_requests": env_int("QUOTA_DEFAULT_MAX_CONCURRENT_REQUESTS", 8, minimum=1),
    "default_max_tokens": env_int("QUOTA_DEFAULT_DEFAULT_MAX_TOKENS", 256, minimum=1),
    "max_tokens_limit": env_int("QUOTA_DEFAULT_MAX_TOKENS_LIMIT", 4096, minimum=1),
    "max_adapters": env_int("QUOTA_DEFAULT_MAX_ADAPTERS", 20, minimum=1),
    "max_adapter_storage_bytes": env_int("QUOTA_DEFAULT_MAX_ADAPTER_STORAGE_BYTES", 2 * 1024**3, minimum=1),
    "fairness_weight": env_int("QUOTA_DEFAULT_FAIRNESS_WEIGHT", 1, minimum=1, maximum=MAX_FAIRNESS_WEIGHT),
    "priority_class": _DEFAULT_PRIORITY_CLASS,
}
if TENANT_QUOTA_DEFAULTS["default_max_tokens"] > TENANT_QUOTA_DEFAULTS["max_tokens_limit"]:
    raise ImproperlyConfigured("QUOTA_DEFAULT_DEFAULT_MAX_TOKENS must be <= QUOTA_DEFAULT_MAX_TOKENS_LIMIT")
# A concurrency slot of a request that never settles (a dead gateway process) is freed after this long.
QUOTA_SLOT_TTL_S = env_int("QUOTA_SLOT_TTL_S", 900, minimum=10)
# Gateway processes cache key lookups this long; revocations reach them at once regardless (tenants.key_auth).
API_KEY_CACHE_TTL_S = env_int("API_KEY_CACHE_TTL_S", 60, minimum=0)
USAGE_RAW_RETENTION_DAYS = env_int("USAGE_RAW_RETENTION_DAYS", 90, minimum=2)
USAGE_ROLLUP_INTERVAL_S = env_int("USAGE_ROLLUP_INTERVAL_S", 900, minimum=60)
CELERY_BEAT_SCHEDULE = {
    "tenants-usage-rollup": {"task": "tenants.tasks.usage_rollup_recent", "schedule": USAGE_ROLLUP_INTERVAL_S},
    "tenants-usage-purge": {"task": "tenants.tasks.usage_purge", "schedule": crontab(hour=3, minute=17)},
    "adapters-sweep": {"task": "adapters.tasks.registry_sweep", "schedule": 900},
    "schemas-sweep": {"task": "schemas.tasks.schemas_sweep", "schedule": 900},
}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "tenants.api.schema.PlatformAutoSchema",
    # `Authorization: Bearer <key>` with a manage-scoped key for scripts; the session for the web UI.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.authentication.ManageKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "tenants.api.pagination.BoundedLimitOffsetPagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "drf_standardized_errors.handler.exception_handler",
    "PAGE_SIZE": 50,
}
# Errors: {"type": ..., "errors": [{"code", "detail", "attr"}]}, documented per status in the schema.
DRF_STANDARDIZED_ERRORS = {
    "EXCEPTION_HANDLER_CLASS": "tenants.api.exceptions.ServiceErrorHandler",
}
_ERROR_ENUMS = ["ValidationErrorEnum", "ClientErrorEnum", "ServerErrorEnum", "ParseErrorCodeEnum", *(
    f"ErrorCode{code}Enum" for code in (401, 403, 404, 405, 406, 415, 429, 500))]
SPECTACULAR_SETTINGS = {
    "TITLE": "LoRA platform management API",
    "DESCRIPTION": ("Tenants, API keys, quotas, usage, adapters and schemas. Inference is the OpenAI-compatible "
                    "/v1 API."),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        **{name: f"drf_standardized_errors.openapi_serializers.{name}.choices" for name in _ERROR_ENUMS},
        "PriorityClassEnum": "tenants.priority.PRIORITY_CHOICES",  # a key's priority and a tenant's class alike
    },
    "POSTPROCESSING_HOOKS": ["drf_standardized_errors.openapi_hooks.postprocess_schema_enums"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # httpx logs every request at INFO: one line per engine call of the gateway is noise, and costs CPU.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- Production hardening (what `manage.py check --deploy` asks for); TLS ends at the proxy in front. ---
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_REDIRECT_EXEMPT = [r"^health$"]
