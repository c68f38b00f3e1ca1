"""The settings of matchmaking and of the all-reduce under one import path.

Each lives with its protocol (``matchmaking/config.py``, ``allreduce/config.py``).
"""

from .allreduce.config import MAX_AVERAGING_TIMEOUT as MAX_AVERAGING_TIMEOUT
from .allreduce.config import MAX_CHUNK_VALUES as MAX_CHUNK_VALUES
from .allreduce.config import MIN_CHUNK_VALUES as MIN_CHUNK_VALUES
from .allreduce.config import AllReduceConfig as AllReduceConfig
from .matchmaking.config import GROUP_ID_SIZE as GROUP_ID_SIZE
from .matchmaking.config import MAX_CODE_LENGTH as MAX_CODE_LENGTH
from .matchmaking.config import MAX_DETAIL_LENGTH as MAX_DETAIL_LENGTH
from .matchmaking.config import MAX_EPOCH as MAX_EPOCH
from .matchmaking.config import MAX_GROUP_SIZE as MAX_GROUP_SIZE
from .matchmaking.config import MAX_JOIN_WAIT as MAX_JOIN_WAIT
from .matchmaking.config import MAX_MATCHMAKING_TIME as MAX_MATCHMAKING_TIME
from .matchmaking.config import MAX_PEER_ID_SIZE as MAX_PEER_ID_SIZE
from .matchmaking.config import MAX_RATE as MAX_RATE
from .matchmaking.config import MAX_RUN_ID_LENGTH as MAX_RUN_ID_LENGTH
from .matchmaking.config import MIN_RATE as MIN_RATE
from .matchmaking.config import MatchmakingConfig as MatchmakingConfig
