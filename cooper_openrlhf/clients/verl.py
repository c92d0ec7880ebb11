"""verl's custom reward function, paid by the reward service.

    # verl 0.9.x (its trainer scores with the reward loop's registered managers; "naive" calls one sample a call):
    reward.custom_reward_function.path=$(python -c "import cooper_openrlhf.clients.verl as m; print(m.__file__)")
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:5000/get_reward

`compute_score_batch` (one request per batch) is for verl's `BatchRewardManager` (`verl.workers.reward_manager`),
which 0.9.1 still ships but its trainer no longer calls (before the reward loop: `custom_reward_function.*` at the
top level with `reward_model.reward_manager=batch`).

verl loads this file by path (`get_custom_reward_fn` -> `load_extern_object`), then the named function with
`reward_kwargs` added to every call; its one import (`cooper_openrlhf.clients.http`, which needs only requests)
must be importable in verl's environment (scripts/verl_venv.sh puts this checkout on the path). The question comes
from `extra_info[question_key]` (verl's GSM8K and MATH preprocessing store it as "question"), so the service runs
with `--no-chat-template`. Each result is a dict with "score" and the service's per-sample logs, which verl's reward
managers log as reward_extra_info. The token comes from COOPER_REWARD_TOKEN (or reward_kwargs.token).
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
