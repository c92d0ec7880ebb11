"""verl's custom reward function, paid by the reward service.

    custom_reward_function.path=$(python -c "import cooper_openrlhf.clients.verl as m; print(m.__file__)")
    custom_reward_function.name=compute_score            # NaiveRewardManager (one sample a call)
    # or name=compute_score_batch with reward_model.reward_manager=batch (one request per batch: faster)
    +custom_reward_function.reward_kwargs.url=http://127.0.0.1:5000/get_reward

verl loads this file by path (`get_custom_reward_fn`: `spec_from_file_location`, then the named function with
`reward_kwargs` added to every call). The question comes from `extra_info[question_key]` (verl's GSM8K and MATH
preprocessing store it as "question"), so the service runs with `--no-chat-template`. Each result is a dict with
"score" and the service's per-sample logs, which verl's reward managers log as reward_extra_info.
"""

from cooper_openrlhf.clients.http import RewardClient

_clients: dict[tuple, RewardClient] = {}


def _client(url: str, **client_kwargs) -> RewardClient:
    key = (url, tuple(sorted(client_kwargs.items())))
    if key not in _clients:
        _clients[key] = RewardClient(url, **client_kwargs)
    return _clients[key]


def _question(extra_info, question_key: str) -> str:
    if not extra_info or question_key not in extra_info:
        raise KeyError(f"extra_info has no {question_key!r}: store the question there in preprocessing, or pass "
                       f"reward_kwargs.question_key")
    return str(extra_info[question_key])


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, *, url: str,
                        question_key: str = "question", **client_kwargs) -> list[dict]:
    questions = [_question(info, question_key) for info in extra_infos]
    scores = _client(url, **client_kwargs).score([q + s for q, s in zip(questions, solution_strs)], questions,
                                                 [str(g) for g in ground_truths])
    return [{"score": reward, **{key.replace("/", "_"): values[i] for key, values in scores.extra_logs.items()}}
            for i, reward in enumerate(scores.rewards)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, url: str,
                  question_key: str = "question", **client_kwargs) -> dict:
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], url=url,
                               question_key=question_key, **client_kwargs)[0]
