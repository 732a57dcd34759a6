"""Settings of a live test server whose channel layer refuses event streams' joins on
demand (tests/server/layer_faults.py), and whose event streams' GETs are answered 503 on
demand as while the database is away (tests/server/stream_fault_urls.py): the layer the
environment gives, otherwise."""

from sectr_web.settings import *  # noqa: F403
from sectr_web.settings import CHANNEL_LAYERS

_REFUSING = {
    "sectr_web.channel_layer.InMemoryChannelLayer": "tests.server.layer_faults.RefusingInMemoryChannelLayer",
    "sectr_web.channel_layer.RedisPubSubChannelLayer": "tests.server.layer_faults.RefusingRedisPubSubChannelLayer",
}
CHANNEL_LAYERS = {"default": {**CHANNEL_LAYERS["default"], "BACKEND": _REFUSING[CHANNEL_LAYERS["default"]["BACKEND"]]}}
ROOT_URLCONF = "tests.server.stream_fault_urls"
