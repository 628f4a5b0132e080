"""A third-party groundkit plugin used by the tests: adds one read-only operation."""

from pydantic import BaseModel, ConfigDict, Field

from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.surfaces.tools import Tool


class WordCountRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    word: str = Field(min_length=1, max_length=100)


class WordCountResponse(BaseModel):
    collection: str
    word: str
    chunks: int


async def word_count(ctx, collection, request):
    col = await ctx.collection(collection)
    rows = await ctx.run(
        col.query,
        "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?",
        ('"' + request.word.replace('"', '""') + '"',),
    )
    return WordCountResponse(collection=collection, word=request.word, chunks=rows[0][0])


TOOL = Tool(
    name="word_count",
    summary="Count the chunks containing a word.",
    request_model=WordCountRequest,
    response_model=WordCountResponse,
    handler=word_count,
    scope="collection",
    method="POST",
    json_route="/{collection}/-/groundkit/word-count.json",
    html_route=None,
)


@hookimpl
def register_tools(register):
    register(TOOL)
