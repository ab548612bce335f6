"""The OpenAI-compatible server: `python -m minisgl serve` (launcher.py explains the processes).

args.py        ServerArgs
launcher.py    starts the workers and uvicorn, stops them
processes.py   the scheduler and tokenizer worker processes
sockets.py     ZMQ inbox/outbox and the scheduler's ZmqSchedulerIO
tokenizer_worker.py  the tokenizer worker's logic (text -> ids, ids -> text)
detokenizer.py incremental detokenisation
chat.py        chat templates
frontend.py    the frontend: the API server's side of the sockets to the tokenizer worker
openai_api.py  the OpenAI API's request and response shapes
app.py         the FastAPI app
"""
