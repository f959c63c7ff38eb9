"""/v1/: the OpenAI-compatible API for API keys, and the playground's session-authenticated twin."""

from django.urls import path, re_path

from gateway import views

app_name = "gateway"

P = "playground/<slug:slug>/"

urlpatterns = [
    path("completions", views.completions, name="completions"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("models", views.models, name="models"),
    path("models/<str:model_id>", views.model, name="model"),
    path(P + "chat/completions", views.playground_chat, name="playground-chat"),
    path(P + "completions", views.playground_completions, name="playground-completions"),
    path(P + "models", views.playground_models, name="playground-models"),
    re_path(r"^(?P<path>.*)$", views.not_found),  # OpenAI-shaped 404s, never the console's HTML page
]
