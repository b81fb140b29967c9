# The front door: agent_blackbox's public names (see __init__.py for what each is for).
# lazy_loader reads this stub, so every import here is relative and names one module;
# each name loads its module on first use.
from ._replay import replay as replay
from .outbox._async import AsyncRecorder as AsyncRecorder
from .outbox._async import AsyncRun as AsyncRun
from .outbox._context import current_run as current_run
from .outbox._core import RunSnapshot as RunSnapshot
from .outbox._effects import EffectOutcome as EffectOutcome
from .outbox._errors import EffectRejected as EffectRejected
from .outbox._protocol import AgentRun as AgentRun
from .outbox._recorder import Recorder as Recorder
from .outbox._recorder import Run as Run
from .outbox._tool import tool as tool
from .outbox.integrations._clients import async_http_client as async_http_client
from .outbox.integrations._clients import http_client as http_client
from .outbox.integrations._instrument import instrument as instrument
from .outbox.integrations._instrument import uninstrument as uninstrument
from .outbox.integrations.anthropic import capture_anthropic as capture_anthropic
from .outbox.integrations.openai import capture_openai as capture_openai
from .replayer._report import ReplayReport as ReplayReport
from .schemas._errors import BlackboxError as BlackboxError
from .schemas._errors import NotSerialisable as NotSerialisable
