from django.contrib import admin
from django.urls import include, path

from sessions_app.accounts.login import ThrottledLoginView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),  # before auth's own
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("sessions_app.api.urls")),
    path("", include("sessions_app.urls")),
]
