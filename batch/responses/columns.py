"""What a stored column's python type cannot say: a 32-bit integer, a value stored as JSON, JSON text.

The records that are stored as they are (`TurnMetrics`, `ToolCallRecord`) and the store's
rows (batch/store/rows.py) annotate their fields with these; the store derives each table's
Arrow schema from the annotations.
"""

from __future__ import annotations

from typing import Annotated, Any

import pyarrow as pa


class JsonValue:
    """Marks a python value that the store dumps to JSON."""


class JsonTextValue:
    """Marks a string that already holds JSON."""


Int32 = Annotated[int, pa.int32()]
Json = Annotated[Any, JsonValue]
JsonText = Annotated[str, JsonTextValue]
