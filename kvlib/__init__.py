"""kvlib: does a KV-cache compression keep the model's quality?"""
