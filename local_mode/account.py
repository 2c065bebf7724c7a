"""The AWS account local mode answers as, and the execution role its jobs and sessions assume.

One definition for both environments: the job notebooks' (SDK v2, ``helpers.sagemaker_session``), local mode's
API, and the training-session notebooks' (SDK v3, ``helpers.training_sessions.connect``). It imports nothing, so
either environment imports it.
"""

ACCOUNT_ID = "123456789012"  # moto's account: the fake execution role and ARNs use it
LOCAL_ROLE = f"arn:aws:iam::{ACCOUNT_ID}:role/SageMakerLocalExecutionRole"
