"""KFP components and Argo (hera) templates for the four steps.

Import the front end you need: ``mnnvl.components.kfp_components`` (needs ``kfp``) or
``mnnvl.components.argo_templates`` (needs ``hera``). This package imports neither.
"""
