"""The example's URLs: the same paths as examples/flask_app.py and fastapi_app.py."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("healthz", views.healthz),
    path("api/items", views.items),
    path("api/search", views.search),
    path("login", views.login),
    path("api/v1/exports/<str:name>", views.export),
    path("reports/<str:name>", views.report),
    path("reports/<str:name>/status", views.report_status),
    path("summary", views.summary),
]
