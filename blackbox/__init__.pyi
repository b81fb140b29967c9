# The public surface of agent_blackbox. Names are loaded lazily (see __init__.py);
# lazy_loader reads this stub, so every import here is relative and names one module.
from .outbox._context import current_run as current_run
from .outbox._tool import tool as tool
from .outbox.integrations._clients import async_http_client as async_http_client
from .outbox.integrations._clients import http_client as http_client
from .outbox.integrations._instrument import instrument as instrument
from .outbox.integrations._instrument import uninstrument as uninstrument
from .outbox.integrations.anthropic import capture_anthropic as capture_anthropic
from .outbox.integrations.openai import capture_openai as capture_openai
