from django.urls import path

from sessions_app import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("sessions/new", views.create_session, name="create_session"),
    path("sessions/<str:session_id>/", views.chat, name="chat"),
    path("sessions/<str:session_id>/messages", views.post_message, name="post_message"),
    path("sessions/<str:session_id>/stop", views.stop, name="stop"),
    path("sessions/<str:session_id>/steer", views.steer, name="steer"),
    path("sessions/<str:session_id>/retry", views.retry, name="retry"),
    path("sessions/<str:session_id>/fork", views.fork, name="fork"),
    path("sessions/<str:session_id>/clear", views.clear, name="clear"),
    path("sessions/<str:session_id>/compact", views.compact, name="compact"),
    path("sessions/<str:session_id>/rename", views.rename, name="rename"),
    path("sessions/<str:session_id>/mode", views.set_mode, name="set_mode"),
    path("sessions/<str:session_id>/model", views.set_model, name="set_model"),
    path("sessions/<str:session_id>/delete", views.delete, name="delete"),
    path("sessions/<str:session_id>/media/<str:sha256>", views.session_media, name="session_media"),
    path("asks/<str:ask_id>/decide", views.decide, name="decide"),
    path("settings/tokens/", views.tokens, name="tokens"),
    path("settings/tokens/<int:token_id>/revoke", views.revoke_token, name="revoke_token"),
    path("approvals/", views.approvals, name="approvals"),
    path("review/", views.review, name="review"),
    path("review/<str:session_id>/", views.review_session, name="review_session"),
]
